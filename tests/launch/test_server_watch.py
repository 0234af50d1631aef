"""The trainer's watch over its server steps (launch/servers.py ServerWatch): a server that dies mid-run
ends the job, but one ended by SIGTERM is first given the time the trainer's own stop signal needs to
arrive (in a job container it comes through the runtime, seconds after the server's)."""

import subprocess
import time

from dockyard.launch.servers import ServerStep, ServerWatch


class Stopper:
    requested = False


def watched(tmp_path, exit_status: int, grace_s: float) -> tuple[ServerWatch, Stopper, list[str]]:
    (tmp_path / "server.log").write_text("serving\n")
    step = ServerStep("rollout server 0", "rollout", "node3", subprocess.Popen(["sh", "-c", f"exit {exit_status}"]),
                      tmp_path / "server.log", tmp_path / "address.json")
    stopper, failures = Stopper(), []
    watch = ServerWatch([step], stopper=stopper, terminated_grace_s=grace_s)
    watch._fail = failures.append   # the real one interrupts the main thread: here, only what it would say
    return watch.start(), stopper, failures


def wait_for(condition, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not condition():
        time.sleep(0.1)
    return condition()


def test_a_server_ended_by_sigterm_is_a_stop_when_the_trainers_own_signal_follows(tmp_path):
    watch, stopper, failures = watched(tmp_path, 143, grace_s=20.0)
    time.sleep(3.0)   # the server's step has ended; the trainer's signal is still on its way
    assert failures == []
    stopper.requested = True
    time.sleep(1.5)
    watch.stop()
    assert failures == []


def test_a_server_ended_by_sigterm_with_no_stop_following_ends_the_job_naming_it(tmp_path):
    watch, _, failures = watched(tmp_path, 143, grace_s=1.0)
    assert wait_for(lambda: failures, 10.0)
    watch.stop()
    assert "rollout server 0 on node node3" in failures[0] and "exited with status 143 during the run" in failures[0]


def test_a_server_that_fails_otherwise_ends_the_job_at_once(tmp_path):
    watch, _, failures = watched(tmp_path, 1, grace_s=60.0)
    assert wait_for(lambda: failures, 5.0)   # not after the SIGTERM grace
    watch.stop()
    assert "exited with status 1 during the run; ending the job" in failures[0] and "serving" in failures[0]
