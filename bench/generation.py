"""Generation backends side by side: decode throughput, refit bandwidth and GRPO step time.

    python bench/generation.py [--parts decode,refit,step] [--steps 6]

- decode: tokens/s of each backend (embedded, vllm) at the loop's batch of grpo_math_smol (16 prompts
  x 8 samples, up to 24 tokens, temperature 1, real prompts), each server started the way
  `dockyard run` starts it; the median of 3 timed batches after one warm-up.
- refit: seconds to push SmolLM2-135M's bf16 weights to one vLLM replica on this machine by each path
  (shared memory and broadcast), as GB/s against a memcpy of the same bytes (target: shared memory
  >= 50% of memcpy).
- step: mean step time of grpo_math_smol with each backend (steps 2.. of a short run, validation and
  checkpoints off; target: vllm no worse than embedded).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _run import REPO, run_dockyard

sys.path.insert(0, str(REPO))

from dockyard import registry  # noqa: E402
from dockyard.config import load_config  # noqa: E402
from dockyard.distributed import free_port  # noqa: E402
from dockyard.processes import stop_processes  # noqa: E402

BACKENDS = ("embedded", "vllm")


OVERRIDES: list[str] = []   # --set: config overrides for every server and run of the bench


def config(backend: str):
    return load_config("grpo_math_smol.yaml", [f"models_dir={REPO / 'models'}", f"generation={backend}",
                                               *OVERRIDES]).config


def start_server(backend: str, folder: Path):
    """One replica as `dockyard run` starts a single one: all cores, its launcher's environment."""
    cfg = config(backend)
    launcher = registry.build("generation_backend", backend, config=cfg)
    port, cores = free_port(), os.cpu_count() or 1
    log = folder / f"{backend}.log"
    with open(log, "w") as handle:
        process = subprocess.Popen(launcher.command(port=port, threads=cores), stdout=handle, stderr=subprocess.STDOUT,
                                   env=dict(os.environ, **launcher.environment(None)), start_new_session=True)
    client = launcher.client(f"http://127.0.0.1:{port}", backend, log)
    started = time.perf_counter()
    client.wait_healthy(600, process)
    return cfg, process, client, time.perf_counter() - started


def loop_prompts(cfg, count: int = 16) -> list[list[int]]:
    from dockyard.data.datasets import PromptLoader, build_messages, load_prompts, prompt_token_ids
    from dockyard.envs.math import MathEnvironment
    from dockyard.models import load_tokenizer

    tokenizer = load_tokenizer(cfg.policy.model_name)
    env = MathEnvironment(cfg.env)
    loader = PromptLoader(load_prompts(cfg.data.datasets[0]), True, cfg.policy.seed)
    return [prompt_token_ids(tokenizer, build_messages(p, cfg.data.add_system_prompt, env.instruction))
            for p in loader.take(count)]


def decode(folder: Path) -> None:
    from dockyard.generation.engine import SamplingParams

    print("decode: 16 prompts x 8 samples, up to 24 tokens, temperature 1 (grpo_math_smol's batch)")
    for backend in BACKENDS:
        cfg, process, client, start_s = start_server(backend, folder)
        try:
            prompts = loop_prompts(cfg)
            rates, seconds = [], []
            for trial in range(4):
                params = SamplingParams(n=8, max_tokens=24, temperature=1.0, seed=trial)
                began = time.perf_counter()
                out = client.generate(prompts, params)
                elapsed = time.perf_counter() - began
                if trial:
                    rates.append(sum(len(c.token_ids) for c in out) / elapsed)
                    seconds.append(elapsed)
            print(f"  {backend:<9} {statistics.median(rates):7.0f} tokens/s   {statistics.median(seconds):5.2f} s "
                  f"a batch   (server up in {start_s:.0f} s)")
        finally:
            client.close()
            stop_processes([process], 30)


def refit(folder: Path) -> None:
    import torch
    from safetensors.torch import load_file

    from dockyard.generation.weight_transfer import SharedMemoryWeights, WeightBroadcaster

    cfg, process, client, _ = start_server("vllm", folder)
    try:
        weights = {k: v.to(torch.bfloat16) for k, v in
                   load_file(str(Path(cfg.policy.model_name) / "model.safetensors")).items() if k != "lm_head.weight"}
        size = sum(t.numel() * t.element_size() for t in weights.values())
        copies = []
        for _ in range(5):
            began = time.perf_counter()
            [t.clone() for t in weights.values()]
            copies.append(time.perf_counter() - began)
        memcpy = size / statistics.median(copies) / 1e9
        print(f"refit: SmolLM2-135M bf16, {size / 1e6:.0f} MB; memcpy of the same tensors {memcpy:.2f} GB/s")
        from safetensors.torch import save_file

        target = Path("/dev/shm" if Path("/dev/shm").is_dir() else folder) / f"dockyard-bench-{os.getpid()}.safetensors"
        writes = []
        for _ in range(3):
            began = time.perf_counter()
            save_file(weights, str(target))
            writes.append(time.perf_counter() - began)
            target.unlink()
        print(f"  (writing the safetensors file alone: {statistics.median(writes):.2f} s; the rest of a shared-memory "
              "refit is vLLM's reload, which repacks every weight for its CPU kernels)")
        paths = {"shared_memory": SharedMemoryWeights([client]),
                 "broadcast": WeightBroadcaster([client], "127.0.0.1", free_port())}
        for name, transfer in paths.items():
            times = []
            for _ in range(4):
                began = time.perf_counter()
                transfer.push(weights.items())
                times.append(time.perf_counter() - began)
            best = statistics.median(times[1:])
            print(f"  {name:<14} {best:5.2f} s   {size / best / 1e9:5.2f} GB/s   "
                  f"{size / best / 1e9 / memcpy:6.1%} of memcpy")
            transfer.close()
    finally:
        client.close()
        stop_processes([process], 30)


def step(steps: int) -> None:
    print(f"step: grpo_math_smol, {steps} steps, mean of steps 2..{steps} (validation and checkpoints off)")
    for backend in BACKENDS:
        with tempfile.TemporaryDirectory(prefix="dockyard-bench-") as scratch:
            rows = run_dockyard("grpo_math_smol.yaml", [f"generation={backend}", *OVERRIDES, f"grpo.max_num_steps={steps}",
                                                        "grpo.val_period=0", "grpo.val_at_start=false",
                                                        "checkpointing.enabled=false"], Path(scratch))
        measured = [r for r in rows if r["step"] > 1]
        mean = lambda key: sum(r.get(key, 0.0) for r in measured) / len(measured)  # noqa: E731
        print(f"  {backend:<9} step {mean('time/step'):5.2f} s   generate {mean('time/generate'):5.2f} s   "
              f"refit {mean('time/refit'):5.2f} s   train {mean('time/train'):5.2f} s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default="decode,refit,step")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--set", nargs="*", default=[], help="config overrides, e.g. policy.precision=fp32")
    args = parser.parse_args()
    OVERRIDES.extend(args.set)
    parts = args.parts.split(",")
    with tempfile.TemporaryDirectory(prefix="dockyard-bench-") as scratch:
        folder = Path(scratch)
        print(f"{os.cpu_count()} cores; logs in {folder} while running")
        if "decode" in parts:
            decode(folder)
        if "refit" in parts:
            refit(folder)
    if "step" in parts:
        step(args.steps)
    return 0


if __name__ == "__main__":
    sys.exit(main())
