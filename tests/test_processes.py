"""Stopping child processes: a child that leads its own session goes with every process it started,
even when the leader exits on SIGTERM and leaves them behind (as vLLM's API server can), or was
killed before the stop (a dead component)."""

import os
import subprocess
import sys
import time

from dockyard.processes import stop_processes

# a leader that exits on SIGTERM at once, and a grandchild that ignores SIGTERM
LEADER = ("import subprocess, sys, time\n"
          "child = subprocess.Popen([sys.executable, '-c', 'import signal, time; "
          "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)'])\n"
          "print(child.pid, flush=True)\n"
          "time.sleep(600)\n")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().split()[2] != "Z"


def test_a_session_leader_is_stopped_with_the_processes_it_started():
    leader = subprocess.Popen([sys.executable, "-c", LEADER], stdout=subprocess.PIPE, text=True, start_new_session=True)
    grandchild = int(leader.stdout.readline())
    time.sleep(0.5)
    assert alive(grandchild)
    started = time.monotonic()
    stop_processes([leader], grace_s=3)
    assert leader.poll() is not None
    deadline = time.monotonic() + 5
    while alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(grandchild), "the grandchild that ignores SIGTERM must be killed with its group"
    assert time.monotonic() - started < 8


def test_the_processes_of_a_leader_that_was_killed_are_stopped_too():
    """A killed vLLM API server leaves its engine core and workers in its group: stopping the run must
    not leave them holding gigabytes."""
    leader = subprocess.Popen([sys.executable, "-c", LEADER], stdout=subprocess.PIPE, text=True, start_new_session=True)
    grandchild = int(leader.stdout.readline())
    leader.kill()
    leader.wait(timeout=10)
    assert alive(grandchild)
    stop_processes([leader], grace_s=2)
    deadline = time.monotonic() + 5
    while alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(grandchild), "the killed leader's group must be stopped"
