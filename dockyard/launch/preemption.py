"""The Slurm side of stopping early: when the allocation ends, and how a run requeues itself."""

from __future__ import annotations

import subprocess
import sys
import time


def allocation_end_time(job_id: str) -> float | None:
    """The job's EndTime (epoch seconds) as Slurm computed it: the allocation's start + its time
    limit, so set-up time counts. None without a limit or when Slurm does not answer."""
    try:
        out = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%e"], capture_output=True, text=True,
                             timeout=30).stdout.split()
    except (OSError, subprocess.SubprocessError):
        return None
    for value in out:
        try:
            return time.mktime(time.strptime(value, "%Y-%m-%dT%H:%M:%S"))
        except ValueError:
            continue   # N/A, NONE, UNLIMITED
    return None


def requeue(job_id: str) -> bool:
    """`scontrol requeue <leader>`: every het component goes back to the queue and restarts together."""
    result = subprocess.run(["scontrol", "requeue", job_id], capture_output=True, text=True, timeout=60)
    if result.returncode != 0:
        state = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True,
                               timeout=30).stdout.split()
        if state and state[0] not in ("RUNNING", "SUSPENDED"):
            # preemption with PreemptMode=REQUEUE: Slurm is already ending this run and requeueing the job
            print(f"dockyard: job {job_id} is already {state[0].lower()} (Slurm requeues it); it resumes from the "
                  "checkpoint when it restarts", file=sys.stderr, flush=True)
            return True
        why = (result.stderr or result.stdout).strip() or f"exit status {result.returncode}"
        print(f"dockyard: scontrol requeue {job_id} failed: {why}. The checkpoint is saved; resubmit the same "
              "config to resume (was the job submitted without --requeue?)", file=sys.stderr, flush=True)
        return False
    print(f"dockyard: job {job_id} requeued; it resumes from the checkpoint when it restarts", file=sys.stderr,
          flush=True)
    return True
