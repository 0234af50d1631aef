"""Who made a sandbox's leftovers: every container, network namespace, folder and cgroup a sandbox
makes carries its trainer's owner token ("<pid>-<start time>"), so that a trainer that starts can tell
what a dead one left behind on this machine (the pid alone could have been reused) and reap it."""

from __future__ import annotations

import os


def _start_time(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            # the command name (field 2) may hold spaces and parentheses: count from the last ')'
            return handle.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def owner_token(pid: int | None = None) -> str:
    """This process's token (or `pid`'s)."""
    pid = os.getpid() if pid is None else pid
    return f"{pid}-{_start_time(pid)}"


def owner_alive(token: str) -> bool:
    """Whether the process that wrote `token` still runs (False for anything unreadable)."""
    pid, _, started = token.partition("-")
    if not pid.isdigit():
        return False
    return _start_time(int(pid)) == started
