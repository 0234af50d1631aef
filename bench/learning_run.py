"""Learning run: SmolLM2-135M greedy accuracy on held-out one-digit arithmetic, before and after GRPO.

    python bench/learning_run.py [--steps 40] [--val-every 10] [overrides...]

Runs configs/grpo_math_smol.yaml (validation at start and every --val-every steps on the 200
held-out prompts) and prints accuracy against cumulative training time (validation and checkpoint
time excluded). Target: +40 points within 15 minutes on a 2-core CPU.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--val-every", type=int, default=10)
    parser.add_argument("--keep", help="run in this folder and keep it (default: a temporary folder)")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    folder = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="dockyard-learning-"))
    folder.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "dockyard.cli", "run", "--config", "grpo_math_smol.yaml",
               f"models_dir={REPO / 'models'}", f"grpo.max_num_steps={args.steps}",
               f"grpo.val_period={args.val_every}", "grpo.val_at_start=true", "checkpointing.enabled=false",
               *args.overrides]
    result = subprocess.run(command, cwd=folder, capture_output=True, text=True)
    if result.returncode != 0:
        print(result.stdout[-3000:], result.stderr[-3000:], file=sys.stderr)
        return result.returncode
    rows = [json.loads(line) for line in next(folder.glob("runs/*/logs/metrics.jsonl")).read_text().splitlines()]
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
