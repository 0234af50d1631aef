"""Submit -> first training step latency of `dockyard-submit` on a Slurm cluster (target <= 30 s on
the local dev cluster, slurm/dev-cluster/start.sh).

    .venv/bin/python bench/submit_latency.py [--config grpo_tiny.yaml] [--nodes 3] [--repeats 3]

Each repeat submits the config to a fresh folder and watches the files the job writes, printing when
sbatch answered, when Slurm started the job, when the generation server published its address, when
it answered /health (trainer rank 0's log) and when the first step's metrics were written.
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
MILESTONES = ("sbatch answered", "job running", "server address", "server healthy", "first step done")


def _sacct_start(job: str) -> float | None:
    out = subprocess.run(["sacct", "-j", job, "-X", "-n", "-P", "-o", "Start", "--noconvert"], capture_output=True,
                         text=True, timeout=30).stdout.split()
    if out and out[0] not in ("Unknown", "None"):
        return time.mktime(time.strptime(out[0], "%Y-%m-%dT%H:%M:%S"))
    return None


def one_run(config: str, nodes: int, timeout_s: float, extra: tuple[str, ...] = ()) -> dict[str, float]:
    folder = Path(tempfile.mkdtemp(prefix="dockyard-latency-"))
    t0 = time.time()
    process = subprocess.Popen([sys.executable, "-c", "import sys; from dockyard.cli import submit_main; sys.exit(submit_main())", "--config", config, "--nodes",
                                str(nodes), f"models_dir={REPO / 'models'}", f"cluster.slurm.folder={folder}/slurm", *extra],
                               cwd=folder, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = process.communicate(timeout=120)
    if process.returncode != 0:
        sys.exit(f"submit failed:\n{out}\n{err}")
    seen = {"sbatch answered": time.time() - t0}
    job = re.search(r"submitted job (\d+)", out).group(1)
    deadline = time.time() + timeout_s
    while len(seen) < len(MILESTONES) and time.time() < deadline:
        if "job running" not in seen and (start := _sacct_start(job)):
            seen["job running"] = start - t0
        if "server address" not in seen and list((folder / "slurm").glob("*_rollout0.address.json")):
            seen["server address"] = time.time() - t0
        rank0 = folder / "slurm" / f"{job}_0_log.err"
        if "server healthy" not in seen and rank0.is_file() and "ready at" in rank0.read_text():
            seen["server healthy"] = time.time() - t0
        metrics = list(folder.glob("runs/*/logs/metrics.jsonl"))
        if "first step done" not in seen and metrics and metrics[0].read_text().strip():
            seen["first step done"] = time.time() - t0
        time.sleep(0.1)
    subprocess.run(["scancel", job], timeout=30)
    missing = [m for m in MILESTONES if m not in seen]
    if missing:
        sys.exit(f"job {job}: no {', '.join(missing)} within {timeout_s:.0f} s (folder {folder})")
    return seen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="grpo_tiny.yaml")
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=300)
    args = parser.parse_args()
    runs = []
    for i in range(args.repeats):
        runs.append(one_run(args.config, args.nodes, args.timeout))
        print(f"run {i + 1}: " + "  ".join(f"{m} {runs[-1][m]:.1f}s" for m in MILESTONES), flush=True)
    print(f"\n{args.config} on {args.nodes} nodes, median of {len(runs)} (seconds after dockyard-submit started):")
    for m in MILESTONES:
        print(f"  {m:<16} {statistics.median(r[m] for r in runs):6.1f}")
    first = statistics.median(r["first step done"] for r in runs)
    print(f"submit -> first training step: {first:.1f} s (target <= 30 s): {'met' if first <= 30 else 'NOT met'}")
    print(json.dumps({"submit_to_first_step_s": first}))


if __name__ == "__main__":
    main()
