"""Start trainer processes with the stop signals (USR2, SIGTERM) blocked.

Slurm's time-limit warning (USR2) and a preemption or scancel (SIGTERM) can reach a task at any
moment, also while Python is still importing torch, long before dockyard installs its handlers; the
default action of both signals ends the process, and a job warned during start-up used to FAIL
instead of requeueing. A blocked signal is neither lost nor acted on: it stays pending through
`exec` until `StopRequests.install()` unblocks it, and is then handled like any other (save at the
next safe point; before the first step nothing is saved and the job requeues or ends).

GNU env (coreutils >= 8.31) blocks them before it execs the command, so no instruction of the task
runs with the default action; older systems get a `python -S` wrapper whose few milliseconds of
start-up are the only window left.
"""

from __future__ import annotations

import functools
import shlex
import signal
import subprocess
import sys
from contextlib import contextmanager
from typing import Iterator

from dockyard.processes import STOP_SIGNALS

_PYTHON_WRAPPER = ("import os, signal, sys; signal.pthread_sigmask(signal.SIG_BLOCK, "
                   "{signal.SIGUSR2, signal.SIGTERM}); os.execvp(sys.argv[1], sys.argv[1:])")


@functools.lru_cache(maxsize=1)
def _env_blocks_signals() -> bool:
    try:
        return subprocess.run(["env", "--block-signal=USR2", "true"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def guard_prefix() -> list[str]:
    """The argv that runs a command with USR2 and SIGTERM blocked."""
    if _env_blocks_signals():
        return ["env", "--block-signal=USR2", "--block-signal=TERM"]
    return [sys.executable, "-S", "-c", _PYTHON_WRAPPER]


def guarded_python() -> str:
    """submitit's `python` command (a shell word list): this interpreter, started guarded."""
    return " ".join(shlex.quote(word) for word in guard_prefix() + [sys.executable])


@contextmanager
def signals_blocked(signals: set[int] = frozenset(STOP_SIGNALS)) -> Iterator[None]:
    """Children started inside inherit the blocked mask (for `dockyard run`, which starts them
    itself); this thread's own mask is restored on the way out, delivering what arrived meanwhile."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, set(signals))
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
