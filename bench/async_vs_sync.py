"""Sync vs async GRPO on a Slurm cluster (the local dev cluster: slurm/dev-cluster/start.sh).

    .venv/bin/python bench/async_vs_sync.py [--config grpo_math_smol_async.yaml] [--nodes 2] [--steps 12]
                                            [overrides...]

Submits the same config twice through dockyard-submit (--wait): once with grpo.async_grpo.enabled
false (and IS correction off: the sync loop trains on-policy), once as configured (async), and
prints for each, over the steps after the first:
  steps / min             60 / mean step time
  trainer idle fraction   share of the step the trainer waits for rollouts: sync, everything but
                          logprobs + advantages + train + checkpoint; async, the wait for the buffer
  generator idle fraction async only: share of the time no request was in flight
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

TRAINING = ("time/logprobs", "time/advantages", "time/train", "time/checkpoint")


def one_run(config: str, nodes: int, steps: int, overrides: list[str]) -> list[dict]:
    folder = Path(tempfile.mkdtemp(prefix="dockyard-async-bench-"))
    command = [sys.executable, "-c", "import sys; from dockyard.cli import submit_main; sys.exit(submit_main())",
               "--config", config, "--nodes", str(nodes), "--wait", f"models_dir={REPO / 'models'}",
               f"cluster.slurm.folder={folder}/slurm", f"grpo.max_num_steps={steps}", "checkpointing.enabled=false",
               "grpo.val_at_start=false", "grpo.val_period=0", *overrides]
    out = subprocess.run(command, cwd=folder, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"{' '.join(command)}\n{out.stdout[-3000:]}{out.stderr[-3000:]}")
    metrics = next(folder.glob("runs/*/logs/metrics.jsonl"))
    return [json.loads(line) for line in metrics.read_text().splitlines() if json.loads(line)["step"] > 1]


def figures(rows: list[dict], asynchronous: bool) -> dict[str, float]:
    step = statistics.mean(r["time/step"] for r in rows)
    if asynchronous:
        idle = statistics.mean(r["time/wait"] for r in rows)
        generator = sum(r["async/generator_idle_seconds"] for r in rows) / sum(r["time/step"] for r in rows)
    else:
        idle = statistics.mean(r["time/step"] - sum(r.get(k, 0.0) for k in TRAINING) for r in rows)
        generator = float("nan")
    return {"steps / min": 60 / step, "step s": step, "trainer idle fraction": idle / step,
            "generator idle fraction": generator}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="grpo_math_smol_async.yaml")
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("overrides", nargs="*", help="for both runs (e.g. policy.precision=fp32)")
    args = parser.parse_args()
    sync = one_run(args.config, args.nodes, args.steps,
                   [*args.overrides, "grpo.async_grpo.enabled=false", "loss_fn.is_correction.enabled=false"])
    asynchronous = one_run(args.config, args.nodes, args.steps, args.overrides)
    table = {"sync": figures(sync, False), "async": figures(asynchronous, True)}
    names = list(table["sync"])
    print(f"{'':<8}" + "".join(f"{name:>25}" for name in names))
    for loop, row in table.items():
        print(f"{loop:<8}" + "".join(f"{row[name]:>25.3g}" for name in names))
    print(f"({len(sync)} and {len(asynchronous)} steps after the first; config {args.config}, {args.nodes} nodes)")


if __name__ == "__main__":
    main()
