"""Ending a sandbox's processes for certain: found in /proc (by user id or by pid namespace), killed
and waited for, never "a signal and a sleep".

A sandbox's processes are exactly those of its own user id (as root: a leased id no other process has)
or those in the pid namespaces its commands were started in (bubblewrap gives each command one). A
process that double-forks, calls setsid or ignores SIGTERM is still one of them; SIGKILL cannot be
ignored, and the wait ends only when none is left but zombies (which can do nothing), or fails
loudly, naming the sandbox.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Callable

from dockyard.sandboxes.base import SandboxError

Selector = Callable[[str], bool]


def _status(pid: str) -> bytes:
    """/proc/<pid>/status (raw reads: a scan of every process must stay in milliseconds)."""
    fd = os.open(f"/proc/{pid}/status", os.O_RDONLY | os.O_CLOEXEC)
    try:
        return os.read(fd, 4096)
    finally:
        os.close(fd)


def _field(status: bytes, name: bytes) -> bytes:
    start = status.find(b"\n" + name + b":")
    if start < 0:
        return b""
    end = status.find(b"\n", start + 1)
    return status[start + len(name) + 2:end if end > 0 else None].strip()


def of_user(*uids: int) -> Selector:
    """Processes with one of `uids` as their real, effective, saved or filesystem user id."""
    wanted = {str(uid).encode() for uid in uids}

    def select(pid: str) -> bool:
        return not wanted.isdisjoint(_field(_status(pid), b"Uid").split())
    return select


def of_uid_range(first: int, last: int) -> Selector:
    """Processes with a real, effective, saved or filesystem user id in [first, last] (a sandbox whose
    user namespace maps a block of ids)."""
    def select(pid: str) -> bool:
        return any(first <= int(uid) <= last for uid in _field(_status(pid), b"Uid").split())
    return select


def any_of(*selectors: Selector) -> Selector:
    """Processes any of the selectors picks (one scan of /proc instead of one each)."""
    def select(pid: str) -> bool:
        return any(each(pid) for each in selectors)
    return select


def in_pid_namespaces(namespaces: set[str]) -> Selector:
    """Processes in any of these pid namespaces (as /proc/<pid>/ns/pid reads: 'pid:[4026532316]')."""
    def select(pid: str) -> bool:
        return os.readlink(f"/proc/{pid}/ns/pid") in namespaces
    return select


def live_processes(select: Selector) -> list[int]:
    """The pids `select` picks, zombies left out (they hold nothing and run nothing)."""
    found = []
    own = os.getpid()
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == own:
            continue
        try:
            if select(pid) and not _field(_status(pid), b"State").startswith(b"Z"):
                found.append(int(pid))
        except OSError:   # it ended while we looked
            continue
    return found


def end_processes(select: Selector, what: str, timeout_s: float = 30.0) -> int:
    """SIGKILL every process `select` picks, again and again (a fork bomb forks while it is killed),
    until none is left; how many were killed. SandboxError naming `what` if some outlive timeout_s."""
    deadline = time.monotonic() + timeout_s
    killed: set[int] = set()
    pause = 0.002
    while True:
        pids = live_processes(select)
        if not pids:
            return len(killed)
        if time.monotonic() > deadline:
            raise SandboxError(f"{what}: {len(pids)} process(es) still alive {timeout_s:.0f} s after SIGKILL "
                               f"(pids {', '.join(map(str, pids[:10]))})")
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.add(pid)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(pause)
        pause = min(pause * 2, 0.05)
