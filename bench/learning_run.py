"""Learning run: SmolLM2-135M greedy accuracy on held-out one-digit arithmetic, before and after GRPO.

    python bench/learning_run.py [--config grpo_math_smol.yaml] [--steps 100] [--val-every 10] [overrides...]

Runs configs/grpo_math_smol.yaml (or --config, e.g. grpo_math_smol_async.yaml) (validation at start and every --val-every steps on the 200
held-out prompts) and prints accuracy against cumulative training time (validation and checkpoint
time excluded). Target: +40 points within 15 minutes on a 2-core CPU.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from _run import run_dockyard


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="grpo_math_smol.yaml")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--val-every", type=int, default=10)
    parser.add_argument("--keep", help="run in this folder and keep it (default: a temporary folder)")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    folder = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="dockyard-learning-"))
    folder.mkdir(parents=True, exist_ok=True)
    rows = run_dockyard(args.config, [f"grpo.max_num_steps={args.steps}", f"grpo.val_period={args.val_every}",
                                                "grpo.val_at_start=true", "checkpointing.enabled=false",
                                                *args.overrides], folder)
    start = next(r["val/accuracy"] for r in rows if r["step"] == 0)
    print(f"{'step':>5}{'train min':>11}{'val acc':>9}{'gain':>8}{'sample acc':>12}")
    print(f"{0:>5}{0.0:>11.1f}{start:>9.1%}{'':>8}")
    train_seconds = 0.0
    for row in rows:
        if row["step"] == 0:
            continue
        train_seconds += row["time/step"] - row.get("time/validate", 0.0) - row.get("time/checkpoint", 0.0)
        if "val/accuracy" in row:
            gain = (row["val/accuracy"] - start) * 100
            print(f"{row['step']:>5}{train_seconds / 60:>11.1f}{row['val/accuracy']:>9.1%}{gain:>+7.0f}p"
                  f"{row['accuracy']:>12.1%}")
    print(f"run folder: {folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
