"""Preemption costs on a Slurm cluster (the local dev cluster: slurm/dev-cluster/start.sh).

    .venv/bin/python bench/preemption.py [--config grpo_tiny.yaml] [--nodes 3] [--repeats 3]

Each repeat submits the config, lets it train a few steps, sends the warning signal the way Slurm
does before a time limit (scancel --signal=USR2, to every step) and measures:
  signal -> durable checkpoint   until latest_checkpointed_iteration.txt names the new step
  save                           the save itself, as the run reports it (target: the line above <= save + 2 s)
  requeue -> task start          Slurm's share: the requeued job waits at least cred_expire (10 s here)
  task start -> first step       dockyard's share: servers, model load, resume, refit, one step
  requeue -> first step          the whole restart (target <= 30 s)
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from dockyard.waiting import WaitTimeout, wait_until  # noqa: E402


def wait(predicate, timeout_s: float, what: str):
    try:
        return wait_until(predicate, timeout_s, what, interval_s=0.05)
    except WaitTimeout as err:
        sys.exit(str(err))


def one_run(config: str, nodes: int) -> dict[str, float]:
    folder = Path(tempfile.mkdtemp(prefix="dockyard-preempt-"))
    out = subprocess.run([sys.executable, "-c", "import sys; from dockyard.cli import submit_main; sys.exit(submit_main())",
                          "--config", config, "--nodes", str(nodes), f"models_dir={REPO / 'models'}",
                          f"cluster.slurm.folder={folder}/slurm", "grpo.max_num_steps=100000",
                          "checkpointing.save_period=100000"], cwd=folder, capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        sys.exit(out.stdout + out.stderr)
    job = re.search(r"submitted job (\d+)", out.stdout).group(1)
    metrics = folder / "runs" / Path(config).stem / "logs" / "metrics.jsonl"
    pointer = folder / "runs" / Path(config).stem / "checkpoints" / "latest_checkpointed_iteration.txt"
    log = folder / "slurm" / f"{job}_0_log.err"

    def steps() -> list[int]:
        return [json.loads(line)["step"] for line in metrics.read_text().splitlines()] if metrics.is_file() else []

    try:
        wait(lambda: len(steps()) >= 5, 300, "5 training steps")
        signalled = time.time()
        subprocess.run(["scancel", "--signal=USR2", job], check=True, timeout=30)
        saved_step = int(wait(lambda: pointer.is_file() and pointer.read_text().strip(), 120, "the checkpoint"))
        durable = time.time()
        save_s = float(wait(lambda: re.search(r"saved step \d+ in ([\d.]+) s", log.read_text()), 60,
                            "the save report").group(1))
        requeued = float(wait(lambda: re.search(r"requeued|already", log.read_text()) and time.time(), 60,
                              "the requeue"))
        started = wait(lambda: "restart 1)" in log.read_text() and time.time(), 300, "the restart")
        first = wait(lambda: any(s > saved_step for s in steps()) and time.time(), 300, "the first step after resume")
    finally:
        subprocess.run(["scancel", job], timeout=30)
    return {"signal -> durable checkpoint": durable - signalled, "save": save_s,
            "requeue -> task start": started - requeued, "task start -> first step": first - started,
            "requeue -> first step": first - requeued}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="grpo_tiny.yaml")
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    runs = []
    for i in range(args.repeats):
        runs.append(one_run(args.config, args.nodes))
        print(f"run {i + 1}: " + "  ".join(f"{k} {v:.2f}s" for k, v in runs[-1].items()), flush=True)
    median = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    print(f"\n{args.config} on {args.nodes} nodes, median of {len(runs)}:")
    for key, value in median.items():
        print(f"  {key:<28} {value:6.2f} s")
    ok_save = median["signal -> durable checkpoint"] <= median["save"] + 2
    ok_restart = median["requeue -> first step"] <= 30
    print(f"signal -> durable checkpoint <= save + 2 s: {'met' if ok_save else 'NOT met'}; "
          f"restart -> first step <= 30 s: {'met' if ok_restart else 'NOT met'}")
    print(json.dumps(median))


if __name__ == "__main__":
    main()
