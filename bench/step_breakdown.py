"""Step breakdown of a local GRPO run: each phase's share of the step and the orchestration overhead.

    python bench/step_breakdown.py [--config grpo_math_smol.yaml] [--steps 4] [overrides...]
    python bench/step_breakdown.py --metrics runs/grpo_math_smol/logs/metrics.jsonl

Runs `dockyard run` in a scratch folder (validation and checkpoints off), or reads the metrics of a
finished run (e.g. the learning run's), then prints the mean of every step after the first (which
pays for warm-up). Overhead = step time minus engine decoding
and trainer forward/backward: HTTP, tokenising, scoring, batch broadcast, weight transfer.
Target: overhead <= 5% of the step.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from _run import run_dockyard

PHASES = ("refit", "generate", "reward", "logprobs", "advantages", "train")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="grpo_math_smol.yaml")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--metrics", help="metrics.jsonl of a finished run: read it instead of running")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    if args.metrics:
        steps = [json.loads(line) for line in Path(args.metrics).read_text().splitlines()]
        source = args.metrics
    else:
        with tempfile.TemporaryDirectory(prefix="dockyard-bench-") as scratch:
            steps = run_dockyard(args.config, [f"grpo.max_num_steps={args.steps}", "grpo.val_period=0",
                                               "grpo.val_at_start=false", "checkpointing.enabled=false",
                                               *args.overrides], Path(scratch))
        source = args.config
    steps = [s for s in steps if s["step"] > 0]   # step 0 is the validation before training
    measured = steps[1:] or steps
    mean = lambda key: sum(s.get(key, 0.0) for s in measured) / len(measured)  # noqa: E731
    step = mean("time/step")
    print(f"{source}: {len(measured)} step(s) measured (of {len(steps)}), mean step {step:.2f} s, "
          f"{os.cpu_count()} cores")
    print(f"{'phase':<22}{'seconds':>10}{'share':>9}")
    for phase in (*PHASES, "validate", "checkpoint"):
        print(f"{phase:<22}{mean('time/' + phase):>10.3f}{mean('time/' + phase) / step:>9.1%}")
    engine = mean("gen/engine_seconds")
    print(f"{'  engine decoding':<22}{engine:>10.3f}{engine / step:>9.1%}")
    print(f"{'orchestration overhead':<22}{mean('time/overhead'):>10.3f}{mean('time/overhead') / step:>9.1%}"
          f"   (target <= 5%)")
    print(f"generation {mean('gen/tokens_per_s'):.0f} tokens/s, training {mean('train/tokens_per_s'):.0f} tokens/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
