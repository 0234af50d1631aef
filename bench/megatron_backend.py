"""The megatron backend against the dtensor backend on SmolLM2-135M, the same batch and settings:
optimizer-step time, refit (the full serving weights gathered on rank 0, as a run sends them) against
this machine's memcpy bandwidth, and a dist checkpoint's save and load against its disk's write
bandwidth. Layouts: each backend on one rank, and megatron TP 3 over 3 gloo ranks (SmolLM2's 3
key/value heads do not split in 2).

    python bench/megatron_backend.py [--steps 3] [--precision bf16] [--layout NAME ...]

Figures are printed, nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
SMOL = REPO / "models" / "smollm2-135m-instruct"
LAYOUTS = {"dtensor, 1 rank": ("dtensor", 1, 1), "megatron, 1 rank": ("megatron", 1, 1),
           "megatron TP 3, 3 ranks": ("megatron", 3, 3)}


def batch(vocab: int):
    """64 samples shaped like grpo_math_smol's: a 33-token prompt per group of 8, 6-24-token answers."""
    import torch

    from dockyard.policy.samples import Sample

    generator = torch.Generator().manual_seed(0)
    samples = []
    for _ in range(8):
        prompt = torch.randint(3, vocab, (33,), generator=generator).tolist()
        for _ in range(8):
            length = int(torch.randint(6, 25, (), generator=generator))
            samples.append(Sample(token_ids=prompt + torch.randint(3, vocab, (length,), generator=generator).tolist(),
                                  prompt_length=33, advantage=float(torch.randn((), generator=generator))))
    return samples


def rank_main(layout: str, steps: int, precision: str, out: str, folder: str) -> None:
    import torch
    import torch.distributed as dist

    from dockyard import registry
    from dockyard.config import load_config
    from dockyard.distributed import init_trainer_world
    from dockyard.io.checkpoint import CheckpointManager

    backend, tp, world_size = LAYOUTS[layout]
    torch.set_num_threads(max(1, os.cpu_count() // world_size))
    world = init_trainer_world(torch.device("cpu"), timeout_s=300, model_parallel_size=tp)
    overrides = [f"policy.model_name={SMOL}", f"policy.backend={backend}", f"policy.precision={precision}",
                 f"cluster.cpu_ranks_per_node={world_size}", "policy.train_micro_batch_size=16", "policy.train_global_batch_size=64", "grpo.num_prompts_per_step=8",
                 "grpo.num_generations_per_prompt=8",
                 "policy.dynamic_batching.enabled=false", "policy.dynamic_batching.share_prompts=false"]
    if backend == "megatron":
        overrides += [f"+policy.megatron_cfg.tensor_model_parallel_size={tp}",
                      f"+policy.megatron_cfg.bf16={str(precision == 'bf16').lower()}"]
    cfg = load_config("grpo_tiny.yaml", overrides).config
    cfg = cfg.model_copy(update={"checkpointing": cfg.checkpointing.model_copy(update={"checkpoint_dir": folder})})
    policy = registry.build("policy_backend", backend, config=cfg, world=world, device=torch.device("cpu"),
                            total_optimizer_steps=steps + 1)
    loss = registry.build("loss", cfg.loss_fn.name, config=cfg.loss_fn)
    samples = batch(49152)
    local = samples[world.data_rank::world.data_size]
    policy.train_mini_batch(local, None, None, loss)   # warm-up: first-touch allocations
    dist.barrier()
    started = time.perf_counter()
    for _ in range(steps):
        policy.train_mini_batch(local, None, None, loss)
    step_s = (time.perf_counter() - started) / steps
    dist.barrier()
    started = time.perf_counter()
    weights = policy.serving_weights(torch.bfloat16)
    refit_s = time.perf_counter() - started
    refit_bytes = sum(t.numel() * t.element_size() for t in weights.values())
    manager = CheckpointManager(cfg.checkpointing, world.rank)
    dist.barrier()
    started = time.perf_counter()
    saved = manager.save(1, policy.checkpoint_state(), {})
    save_s = time.perf_counter() - started
    state_bytes = sum(p.stat().st_size for p in saved.rglob("*") if p.is_file())
    dist.barrier()
    started = time.perf_counter()
    manager.load(saved, policy.checkpoint_state())
    load_s = time.perf_counter() - started
    if world.is_main:
        Path(out).write_text(json.dumps({"step_s": step_s, "refit_s": refit_s, "refit_bytes": refit_bytes,
                                         "save_s": save_s, "load_s": load_s, "state_bytes": state_bytes}))
    dist.barrier()
    dist.destroy_process_group()
    os._exit(0)


def launch(layout: str, steps: int, precision: str, folder: Path) -> dict:
    from dockyard.distributed import free_port

    world = LAYOUTS[layout][2]
    out, port = folder / "result.json", free_port()
    processes = [subprocess.Popen([sys.executable, __file__, "--rank", layout, "--steps", str(steps), "--precision",
                                   precision, "--out", str(out), "--folder", str(folder / "checkpoints")],
                                  env=dict(os.environ, RANK=str(r), WORLD_SIZE=str(world), LOCAL_RANK=str(r),
                                           MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)),
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                 for r in range(world)]
    logs = [p.communicate(timeout=1800)[0] for p in processes]
    if any(p.returncode for p in processes):
        raise SystemExit(f"{layout} failed:\n" + "\n".join(log[-2000:] for log in logs))
    return json.loads(out.read_text())


def memcpy_bandwidth(size_mib: int = 256) -> float:
    import torch

    source = torch.ones(size_mib << 18)   # float32: 4 bytes each
    target = torch.empty_like(source)
    target.copy_(source)
    started = time.perf_counter()
    for _ in range(5):
        target.copy_(source)
    return 5 * size_mib / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--precision", default="bf16", choices=["bf16", "fp32"])
    parser.add_argument("--layout", action="append", choices=list(LAYOUTS))
    parser.add_argument("--rank", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank:
        rank_main(args.rank, args.steps, args.precision, args.out, args.folder)
        return
    from export import disk_write_bandwidth

    with tempfile.TemporaryDirectory(prefix="dockyard-megatron-", dir=REPO / ".cache") as root:
        memcpy, disk = memcpy_bandwidth(), disk_write_bandwidth(Path(root))
        print(f"SmolLM2-135M, {args.precision}, 64 samples (33-token prompts, 6-24-token answers) per step; "
              f"memcpy {memcpy:.0f} MiB/s, disk write {disk:.0f} MiB/s")
        print(f"{'layout':<26}{'step s':>8}{'refit s':>9}{'refit MiB':>11}{'MiB/s':>8}{'save s':>8}{'load s':>8}"
              f"{'state MiB':>11}{'save MiB/s':>12}")
        results = {}
        for index, layout in enumerate(args.layout or list(LAYOUTS)):
            folder = Path(root) / str(index)
            folder.mkdir()
            r = results[layout] = launch(layout, args.steps, args.precision, folder)
            mib = r["refit_bytes"] / 2**20
            state = r["state_bytes"] / 2**20
            print(f"{layout:<26}{r['step_s']:>8.2f}{r['refit_s']:>9.2f}{mib:>11.0f}{mib / r['refit_s']:>8.0f}"
                  f"{r['save_s']:>8.2f}{r['load_s']:>8.2f}{state:>11.0f}{state / r['save_s']:>12.0f}")
        if "dtensor, 1 rank" in results and "megatron, 1 rank" in results:
            ratio = results["megatron, 1 rank"]["step_s"] / results["dtensor, 1 rank"]["step_s"]
            print(f"megatron / dtensor step time on one rank: {ratio:.2f}x (target: within 1.5x on CPU)")


if __name__ == "__main__":
    main()
