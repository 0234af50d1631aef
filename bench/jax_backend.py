"""The jax backend against the dtensor backend on SmolLM2-135M, the same batch and settings (one trainer
process each): optimizer-step time in steady state, the compile time of the first step of a fresh
start and of a restart that finds the persistent compilation cache (a requeue), refit and orbax
checkpoint times, and where the time goes: this machine's matmul throughput under XLA and torch.

    python bench/jax_backend.py [--steps 3] [--precision bf16]

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


def one_process(backend: str, steps: int, precision: str, cache: str, out: str, folder: str) -> None:
    import torch

    from dockyard import registry
    from dockyard.config import load_config
    from dockyard.distributed import init_trainer_world
    from dockyard.io.checkpoint import CheckpointManager
    from megatron_backend import batch

    started = time.perf_counter()
    world = init_trainer_world(torch.device("cpu"), timeout_s=300, model_parallel_size=1)
    overrides = [f"policy.model_name={SMOL}", f"policy.backend={backend}", f"policy.precision={precision}",
                 "cluster.num_nodes=2", "policy.train_micro_batch_size=16", "policy.train_global_batch_size=64",
                 "grpo.num_prompts_per_step=8", "grpo.num_generations_per_prompt=8",
                 "policy.dynamic_batching.enabled=false", "policy.dynamic_batching.share_prompts=false"]
    if backend == "jax":
        overrides.append(f"policy.jax_cfg.compilation_cache_dir={cache}")
    cfg = load_config("grpo_tiny.yaml", overrides).config
    cfg = cfg.model_copy(update={"checkpointing": cfg.checkpointing.model_copy(update={"checkpoint_dir": folder})})
    policy = registry.build("policy_backend", backend, config=cfg, world=world, device=torch.device("cpu"),
                            total_optimizer_steps=steps + 1)
    loss = registry.build("loss", cfg.loss_fn.name, config=cfg.loss_fn)
    samples = batch(49152)
    built_s = time.perf_counter() - started
    started = time.perf_counter()
    policy.train_mini_batch(samples, None, None, loss)   # compiles (jax); first-touch allocations (torch)
    first_s = time.perf_counter() - started
    started = time.perf_counter()
    for _ in range(steps):
        policy.train_mini_batch(samples, None, None, loss)
    step_s = (time.perf_counter() - started) / steps
    started = time.perf_counter()
    policy.serving_weights(torch.bfloat16)
    refit_s = time.perf_counter() - started
    manager = CheckpointManager(cfg.checkpointing, world.rank)
    started = time.perf_counter()
    saved = manager.save(1, policy.checkpoint_state(), {})
    save_s = time.perf_counter() - started
    started = time.perf_counter()
    manager.load(saved, policy.checkpoint_state())
    load_s = time.perf_counter() - started
    # the first step compiles its programs (jax) or touches its memory first (torch): beyond a steady step
    compile_s = first_s - step_s
    Path(out).write_text(json.dumps({"built_s": built_s, "first_s": first_s, "compile_s": compile_s, "step_s": step_s,
                                     "refit_s": refit_s, "save_s": save_s, "load_s": load_s}))
    os._exit(0)


def launch(backend: str, steps: int, precision: str, cache: Path, folder: Path) -> dict:
    from dockyard.distributed import free_port

    folder.mkdir(parents=True)
    out = folder / "result.json"
    process = subprocess.run([sys.executable, __file__, "--one", backend, "--steps", str(steps), "--precision",
                              precision, "--cache", str(cache), "--out", str(out), "--folder",
                              str(folder / "checkpoints")],
                             env=dict(os.environ, RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                                      MASTER_PORT=str(free_port())),
                             capture_output=True, text=True, timeout=3600)
    if process.returncode:
        raise SystemExit(f"{backend} failed:\n{(process.stdout + process.stderr)[-3000:]}")
    return json.loads(out.read_text())


def matmul_throughput() -> dict[str, float]:
    """GFLOP/s of a [2048, 576] x [576, 1536] product (SmolLM2's MLP) under XLA and torch, fp32 and bf16."""
    import jax
    import jax.numpy as jnp
    import torch

    flops = 2 * 2048 * 576 * 1536
    out = {}
    for name, jax_type, torch_type in (("fp32", jnp.float32, torch.float32), ("bf16", jnp.bfloat16, torch.bfloat16)):
        a, b = jnp.ones((2048, 576), jax_type), jnp.ones((1536, 576), jax_type)
        product = jax.jit(lambda x, y: x @ y.T)
        product(a, b).block_until_ready()
        started = time.perf_counter()
        for _ in range(20):
            product(a, b).block_until_ready()
        out[f"xla {name}"] = flops * 20 / (time.perf_counter() - started) / 1e9
        x, y = torch.ones(2048, 576, dtype=torch_type), torch.ones(1536, 576, dtype=torch_type)
        x @ y.T
        started = time.perf_counter()
        for _ in range(20):
            x @ y.T
        out[f"torch {name}"] = flops * 20 / (time.perf_counter() - started) / 1e9
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--precision", default="bf16", choices=["bf16", "fp32"])
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--cache", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        one_process(args.one, args.steps, args.precision, args.cache, args.out, args.folder)
        return
    (REPO / ".cache").mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="dockyard-jax-", dir=REPO / ".cache") as root:
        cache = Path(root) / "compilation_cache"
        runs = {"dtensor": launch("dtensor", args.steps, args.precision, cache, Path(root) / "dtensor"),
                "jax (fresh start)": launch("jax", args.steps, args.precision, cache, Path(root) / "jax-1"),
                "jax (restart, cache)": launch("jax", args.steps, args.precision, cache, Path(root) / "jax-2")}
    print(f"SmolLM2-135M, {args.precision}, 64 samples (33-token prompts, 6-24-token answers) per step, one process")
    print(f"{'backend':<22}{'build s':>8}{'1st step s':>11}{'compile s':>10}{'step s':>8}{'refit s':>9}"
          f"{'save s':>8}{'load s':>8}")
    for name, r in runs.items():
        print(f"{name:<22}{r['built_s']:>8.1f}{r['first_s']:>11.1f}{r['compile_s']:>10.1f}{r['step_s']:>8.2f}"
              f"{r['refit_s']:>9.2f}{r['save_s']:>8.2f}{r['load_s']:>8.2f}")
    ratio = runs["jax (fresh start)"]["step_s"] / runs["dtensor"]["step_s"]
    print(f"jax / dtensor step time (steady state): {ratio:.2f}x")
    print("matmul GFLOP/s ([2048, 576] x [576, 1536]): " + ", ".join(
        f"{name} {value:.0f}" for name, value in matmul_throughput().items()))


if __name__ == "__main__":
    main()
