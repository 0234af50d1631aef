"""What the Slurm job tests share: submitting a held grpo_tiny job and reading its state, steps and logs."""

import json
import os
import re
import subprocess
from pathlib import Path

from dockyard.waiting import wait_until
from tests.launch.conftest import run_submit
from tests.launch.holding import hold_overrides


def submit(workdir: Path, model: Path, *overrides: str) -> str:
    """A grpo_tiny job on 3 nodes, scored by the reward that holds it where the test says (holding.py)."""
    result = run_submit(workdir, model, "--nodes", "3", *hold_overrides(workdir), *overrides)
    assert result.returncode == 0, result.stdout + result.stderr
    return re.search(r"submitted job (\d+)", result.stdout).group(1)


def logged_steps(workdir: Path) -> list[int]:
    path = workdir / "runs" / "grpo_tiny" / "logs" / "metrics.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line)["step"] for line in path.read_text().splitlines() if line.strip()]


def job_state(job: str) -> str:
    out = subprocess.run(["sacct", "-j", job, "-X", "-n", "-P", "-o", "JobID,State"], capture_output=True, text=True,
                         timeout=30).stdout
    states = dict(line.split("|") for line in out.splitlines() if line)
    return states.get(f"{job}+0", states.get(job, "UNKNOWN")).split()[0]


def restarts(job: str) -> int:
    out = subprocess.run(["scontrol", "show", "job", job], capture_output=True, text=True, timeout=30).stdout
    return int(re.search(r"Restarts=(\d+)", out).group(1))


def wait_ended(job: str, timeout_s: float = 300) -> str:
    return wait_until(lambda: (s := job_state(job)) in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT") and s,
                      timeout_s, f"job {job} to end")


def rank0_log(workdir: Path, job: str) -> str:
    return (workdir / "slurm" / f"{job}_0_log.err").read_text(errors="replace")


def slurm_events(job: str) -> list[str]:
    """What slurmctld logged of this job (its starts, requeues, signals and ends), for a failure's message."""
    conf = Path(os.environ.get("SLURM_CONF", "/etc/slurm/slurm.conf"))
    found = re.search(r"^SlurmctldLogFile=(.+)$", conf.read_text(), re.M) if conf.is_file() else None
    log = Path(found.group(1)) if found else None
    if log is None or not log.is_file():
        return []
    return [line for line in log.read_text(errors="replace").splitlines() if f"JobId={job}+" in line or f"JobId={job} " in line]


def signals_received(workdir: Path, job: str) -> int:
    """How many stop signals rank 0 has reported, over all incarnations of the job."""
    path = workdir / "slurm" / f"{job}_0_log.err"
    return path.read_text(errors="replace").count("dockyard: received ") if path.is_file() else 0
