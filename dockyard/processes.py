"""Child processes the drivers start (the local run's engine and ranks, the Slurm driver's server
steps): stopping them within a grace time, and quoting the end of their logs in error messages."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path
from typing import Iterable


def stop_processes(processes: Iterable[subprocess.Popen], grace_s: float) -> None:
    """SIGTERM to every running one, then SIGKILL to those still alive after grace_s."""
    processes = list(processes)
    for process in processes:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            process.send_signal(signal.SIGCONT)   # a stopped (hung) process handles the SIGTERM only once continued
    deadline = time.monotonic() + grace_s
    for process in processes:
        try:
            process.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


def log_tail(path: Path | None, lines: int = 15) -> str:
    """The last lines of a log, indented for an error message; "" when there is none."""
    if path is None or not path.is_file():
        return ""
    text = path.read_text(errors="replace").splitlines()[-lines:]
    return "\n".join("    | " + line for line in text)
