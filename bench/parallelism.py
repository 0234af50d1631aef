"""Trainer memory and step time on SmolLM2-135M per parallel layout, in one run: FSDP data parallel,
tensor parallel, activation checkpointing on each, context parallel and LoRA, over 3 real gloo ranks
(NCCL and CUDA peaks when the machine has GPUs). 3, not 2: SmolLM2-135M has 9 attention and 3
key/value heads, which TP 2 cannot split.

    python bench/parallelism.py [--steps 1] [--response 128] [--layout NAME ...]

Per rank it prints:
- the bytes autograd keeps for backward per micro-batch of 4 sequences (each storage counted once:
  activations, logits, the gathered weights the backward needs);
- the resident memory after one warm-up step and the peak above it during the measured steps
  (sampled every 5 ms from /proc on CPU; torch.cuda.memory_allocated / max_memory_allocated on GPU);
- the mean optimizer-step time after one warm-up step.
Every layout trains the same 12 sequences per step. Figures are printed, nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
SMOL = REPO / "models" / "smollm2-135m-instruct"
RANKS = 3
LAYOUTS = {   # name -> (tensor_parallel_size, context_parallel_size, activation_checkpointing, LoRA)
    "FSDP DP 3": (1, 1, False, False),
    "FSDP DP 3 + activation checkpointing": (1, 1, True, False),
    "TP 3": (3, 1, False, False),
    "TP 3 + activation checkpointing": (3, 1, True, False),
    "CP 3": (1, 3, False, False),
    "LoRA r8 q/k/v/o (FSDP DP 3)": (1, 1, False, True),
}


def resident_bytes() -> int:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class PeakSampler(threading.Thread):
    def __init__(self):
        super().__init__(daemon=True)
        self.peak, self.running = resident_bytes(), True

    def run(self):
        while self.running:
            self.peak = max(self.peak, resident_bytes())
            time.sleep(0.005)


def rank_main(layout: str, steps: int, response: int, out: str) -> None:
    import torch
    import torch.distributed as dist

    from dockyard import registry
    from dockyard.config import load_config
    from dockyard.distributed import init_trainer_world
    from dockyard.policy.samples import Sample

    tp, cp, checkpointing, lora = LAYOUTS[layout]
    gpu = torch.cuda.is_available()
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if gpu else torch.device("cpu")
    if gpu:
        torch.cuda.set_device(device)
    else:
        torch.set_num_threads(max(1, (os.cpu_count() or 2) // RANKS))
    world = init_trainer_world(device, timeout_s=600, model_parallel_size=tp * cp)
    cfg = load_config("grpo_tiny.yaml", [
        f"policy.model_name={SMOL}", f"policy.dtensor_cfg.tensor_parallel_size={tp}",
        f"policy.dtensor_cfg.context_parallel_size={cp}",
        f"policy.dtensor_cfg.activation_checkpointing={str(checkpointing).lower()}",
        f"policy.max_total_sequence_length={64 + response}", "policy.train_micro_batch_size=4",
        f"policy.lora.enabled={str(lora).lower()}",
        f"cluster.gpus_per_node={1 if gpu else 0}", "cluster.cpu_ranks_per_node=1", "cluster.num_nodes=4",
        "grpo.num_prompts_per_step=3", "policy.train_global_batch_size=12",   # 12 rollouts: 3 ranks divide them
    ]).config
    policy = registry.build("policy_backend", "dtensor", config=cfg, world=world, device=device,
                            total_optimizer_steps=steps + 1)
    loss = registry.build("loss", cfg.loss_fn.name, config=cfg.loss_fn)
    generator = torch.Generator().manual_seed(0)
    samples = [Sample(token_ids=torch.randint(10, 40000, (64 + response,), generator=generator).tolist(),
                      prompt_length=64, advantage=float(torch.randn((), generator=generator))) for _ in range(12)]
    local = samples[world.data_rank::world.data_size]
    policy.train_mini_batch(local, None, None, loss)   # warm-up: first-touch allocations, FSDP's buffers
    dist.barrier()
    base = torch.cuda.memory_allocated(device) if gpu else resident_bytes()
    if gpu:
        torch.cuda.reset_peak_memory_stats(device)
    sampler = PeakSampler()
    sampler.start()
    saved: dict[int, int] = {}

    def keep(tensor):
        try:
            storage = tensor.untyped_storage()
            saved.setdefault(storage.data_ptr(), storage.nbytes())
        except (RuntimeError, NotImplementedError):   # a tensor subclass without its own storage
            saved.setdefault(id(tensor), tensor.numel() * tensor.element_size())
        return tensor

    started = time.perf_counter()
    with torch.autograd.graph.saved_tensors_hooks(keep, lambda tensor: tensor):
        for _ in range(steps):
            policy.train_mini_batch(local, None, None, loss)
    dist.barrier()
    seconds = (time.perf_counter() - started) / steps
    sampler.running = False
    sampler.join()
    peak = torch.cuda.max_memory_allocated(device) if gpu else sampler.peak
    figures = [None] * world.world_size
    micro_batches = steps * -(-len(local) // cfg.policy.train_micro_batch_size)
    dist.all_gather_object(figures, {"rank": world.rank, "base": base, "above": max(0, peak - base),
                                     "saved": sum(saved.values()) / micro_batches, "step_s": seconds})
    if world.is_main:
        Path(out).write_text(json.dumps(figures))
    dist.destroy_process_group()


def launch(layout: str, steps: int, response: int, out: Path) -> list[dict]:
    from dockyard.distributed import free_port

    port = free_port()
    processes = [subprocess.Popen([sys.executable, __file__, "--rank-of", layout, "--steps", str(steps),
                                   "--response", str(response), "--out", str(out)],
                                  env=dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(RANKS),
                                           MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)))
                 for rank in range(RANKS)]
    for process in processes:
        if process.wait(timeout=1800):
            raise SystemExit(f"{layout}: a rank exited with status {process.returncode}")
    return json.loads(out.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1)
    parser.add_argument("--response", type=int, default=128, help="response tokens per sequence (prompt: 64)")
    parser.add_argument("--layout", action="append", choices=list(LAYOUTS), help="only these (default: all)")
    parser.add_argument("--rank-of", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank_of:
        rank_main(args.rank_of, args.steps, args.response, args.out)
        return
    if not (SMOL / "config.json").is_file():
        raise SystemExit(f"{SMOL} missing: python tools/smollm2_to_hf.py builds it")
    print(f"SmolLM2-135M, fp32, {RANKS} ranks, 12 sequences of {64 + args.response} tokens per step, micro-batch 4")
    print(f"{'layout':<38} {'rank':>4} {'saved for backward MiB':>23} {'after warm-up MiB':>17} "
          f"{'peak above MiB':>15} {'step s':>7}")
    out = Path(os.environ.get("TMPDIR", "/tmp")) / f"dockyard-parallelism-{os.getpid()}.json"
    for layout in args.layout or LAYOUTS:
        for row in launch(layout, args.steps, args.response, out):
            print(f"{layout:<38} {row['rank']:>4} {row['saved'] / 2**20:>23.0f} {row['base'] / 2**20:>17.0f} "
                  f"{row['above'] / 2**20:>15.0f} {row['step_s']:>7.2f}", flush=True)
    out.unlink(missing_ok=True)


if __name__ == "__main__":
    main()
