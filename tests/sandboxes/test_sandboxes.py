"""bubblewrap and podman sandboxes, for real: what a command can and cannot do, and that the caps
hold. Each test breaks if the guard it names is removed."""

import os
import secrets
import subprocess
import threading
import time
from pathlib import Path

import pytest

from dockyard.config.schema.env import SandboxConfig
from dockyard.sandboxes.base import SandboxError, SandboxLimits, SandboxSpec
from dockyard.sandboxes.bubblewrap import BubblewrapSandbox, bwrap_path
from dockyard.sandboxes.factory import SandboxFactory, limits_from
from dockyard.sandboxes.podman import PodmanSandbox, podman_path
from dockyard.waiting import wait_until

LIMITS = SandboxLimits(command_timeout_s=20, memory_mb=256, max_processes=64, file_size_mb=8, output_bytes=4096)
BACKENDS = [pytest.param(BubblewrapSandbox, id="bubblewrap", marks=pytest.mark.skipif(
                bwrap_path() is None, reason="bubblewrap is not installed (tools/install.sh)")),
            pytest.param(PodmanSandbox, id="podman", marks=pytest.mark.skipif(
                podman_path() is None, reason="podman is not installed (tools/install.sh)"))]
needs_bwrap = pytest.mark.skipif(bwrap_path() is None, reason="bubblewrap is not installed (tools/install.sh)")


@pytest.fixture(params=BACKENDS)
def sandbox(request, tmp_path):
    (tmp_path / "input.txt").write_text("task input\n")
    spec = SandboxSpec(workdir="/app", files=[(tmp_path / "input.txt", "/app/data/input.txt")],
                       env={"TASK_VAR": "from the Dockerfile"})
    with request.param(spec, LIMITS) as box:
        yield box


def host_processes(pattern: str) -> list[str]:
    out = subprocess.run(["pgrep", "-af", pattern], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if "pgrep" not in line]


def test_files_workdir_and_a_clean_environment(sandbox, monkeypatch):
    monkeypatch.setenv("DOCKYARD_TRAINER_SECRET", "hunter2")
    result = sandbox.run("pwd; cat data/input.txt; echo $TASK_VAR; env")
    assert result.ok
    lines = result.output.splitlines()
    assert lines[:3] == ["/app", "task input", "from the Dockerfile"]
    assert "hunter2" not in result.output and "DOCKYARD_TRAINER_SECRET" not in result.output
    assert "HOME=/app" in lines


@pytest.mark.parametrize("backend", BACKENDS)
def test_copied_files_land_as_docker_places_them_and_a_solution_may_write_beside_them(backend, tmp_path):
    # `COPY data.csv /data.csv`: bubblewrap made /data.csv a folder holding data.csv, and the task's tests
    # that read it failed; the copy out reads the same file back
    (tmp_path / "data.csv").write_text("a,b\n1,2\n")
    spec = SandboxSpec(workdir="/app", files=[(tmp_path / "data.csv", "/data.csv"), (tmp_path / "data.csv", "/opt/in/x.csv")])
    with backend(spec, LIMITS) as box:
        shown = box.run("test -f /data.csv && cat /data.csv && test -f /opt/in/x.csv && echo nested-too")
        assert shown.output.splitlines() == ["a,b", "1,2", "nested-too"], shown.output
        # a solution writes next to its input, as root does in Docker (podman's made folders were root's)
        assert box.run("echo out > /opt/in/out.csv && cat /opt/in/out.csv").output.strip() == "out"
        assert any(folder == "/opt" for folder in box.agent_writable())   # and the tests' PATH leaves it out
        assert box.run("echo 3,4 >> /data.csv").ok   # the agent may change it, as in a container
        box.copy_out("/data.csv", tmp_path / "back.csv")
        assert (tmp_path / "back.csv").read_text() == "a,b\n1,2\n3,4\n"
    # the host view's /etc is this machine's, read-only: named, with the way out (podman said 'read-only file system')
    with pytest.raises(SandboxError, match=r"cannot copy into /etc/app/x.csv \(a system folder of the sandbox\); "
                                           r"env.sandbox.task_images: build runs a task on its own image"):
        backend(SandboxSpec(workdir="/app", files=[(tmp_path / "data.csv", "/etc/app/x.csv")]), LIMITS)


@pytest.mark.skipif(os.geteuid() != 0, reason="as a normal user the commands run as that user, who has a name")
def test_the_sandboxes_users_have_names_for_whoami_getpass_and_ls(sandbox):
    shown = sandbox.run("whoami; python3 -c 'import getpass, pwd, os; print(getpass.getuser(), "
                        "pwd.getpwuid(os.getuid()).pw_dir)'; id -gn; stat -c %U .")
    assert shown.ok and shown.output.split() == ["sandbox", "sandbox", "/app", "sandbox", "sandbox"], shown.output
    assert sandbox.run("grep -c '^root:' /etc/passwd").output.strip() == "1"   # the rest of the file is kept
    sandbox.hand_over()
    assert sandbox.run("whoami; stat -c %U .").output.split() == ["verifier", "verifier"]


def test_no_network(sandbox):
    result = sandbox.run("python3 -c 'import socket; socket.create_connection((\"1.1.1.1\", 80), timeout=3)'")
    assert result.exit_code != 0 and "Network is unreachable" in result.output


def test_writes_outside_the_workspace_fail_and_the_host_is_unchanged(sandbox):
    probe = f"dockyard-probe-{secrets.token_hex(4)}"
    result = sandbox.run(f"echo x > /etc/{probe}; echo x > /{probe}; echo x > /usr/{probe}; echo ok > kept.txt")
    # bubblewrap's root is read-only; podman's is the container's own, closed to the sandbox's user
    assert result.output.count("Read-only file system") + result.output.count("Permission denied") == 3
    for folder in ("/etc", "/", "/usr"):
        assert not Path(folder, probe).exists()
    assert sandbox.run("cat kept.txt").output.strip() == "ok"   # the workspace persists between commands


def test_the_hosts_home_and_this_repository_are_not_visible(sandbox, tmp_path):
    secret = Path.home() / f".dockyard-secret-{secrets.token_hex(4)}"
    secret.write_text("do not read")
    try:
        result = sandbox.run(f"cat {secret}; ls {Path(__file__).parent}; cat /etc/shadow")
        assert "do not read" not in result.output
        assert "No such file or directory" in result.output
        if os.geteuid() == 0:   # the sandbox runs as its own user: root-only files stay closed
            assert "Permission denied" in result.output
    finally:
        secret.unlink()


def test_a_fork_bomb_is_contained_and_leaves_nothing_behind(sandbox):
    started = time.monotonic()
    result = sandbox.run("bomb() { bomb | bomb & }; bomb 2>/dev/null; sleep 1; echo survived", timeout_s=15)
    assert time.monotonic() - started < 30
    assert "survived" in result.output or result.timed_out
    assert sandbox.run("echo still usable").output.strip() == "still usable"
    if os.geteuid() == 0:   # every process of the sandbox's own user is gone (the kernel reaps them)
        wait_until(lambda: subprocess.run(["pgrep", "-u", str(sandbox.uid)], capture_output=True).stdout == b"",
                   15, f"the processes of sandbox user {sandbox.uid} to end")


def test_memory_past_the_cap_is_refused(sandbox):
    result = sandbox.run("python3 -c 'x = bytearray(600 * 1024 * 1024); print(len(x))'")
    # per process (bubblewrap's RLIMIT_AS) or for the container (podman's cgroup: the OOM killer)
    assert "MemoryError" in result.output or result.exit_code == 137   # 137: SIGKILL from the OOM killer
    assert str(600 * 1024 * 1024) not in result.output


def test_a_huge_file_stops_at_the_file_size_cap(sandbox):
    sandbox.run("head -c 50000000 /dev/zero > big.bin")
    size = int(sandbox.run("stat -c %s big.bin").output)
    assert size <= 8 * 1024 * 1024


def test_a_command_past_its_timeout_is_killed_with_its_background_processes(sandbox):
    marker = f"sleep {400 + secrets.randbelow(100)}"
    started = time.monotonic()
    result = sandbox.run(f"({marker} &); {marker}", timeout_s=2)
    assert result.timed_out and result.exit_code is None
    assert time.monotonic() - started < 10
    time.sleep(0.5)
    assert not host_processes(marker)


def test_background_processes_end_with_their_command(sandbox):
    marker = f"sleep {500 + secrets.randbelow(100)}"
    assert sandbox.run(f"{marker} & echo started").output.strip() == "started"
    time.sleep(0.5)
    assert not host_processes(marker)


def test_output_is_capped_and_says_so(sandbox):
    result = sandbox.run("seq 1 100000")
    assert result.truncated and "bytes of output left out" in result.output
    assert result.output.startswith("1\n2\n") and result.output.rstrip().endswith("100000")
    assert len(result.output) < 4096 + 200


def test_a_shell_session_keeps_its_state_and_survives_a_timeout(sandbox):
    shell = sandbox.shell()
    assert shell.run("cd data && export COUNT=3").ok
    assert shell.run("pwd; echo $COUNT").output.splitlines() == ["/app/data", "3"]
    assert shell.run("false").exit_code == 1
    hung = shell.run("sleep 60", timeout_s=1)
    assert hung.timed_out and "the shell was killed" in hung.output
    fresh = shell.run("pwd")
    assert fresh.ok and fresh.output.splitlines() == ["[the previous shell ended; this is a new shell]", "/app"]


@pytest.mark.skipif(os.geteuid() != 0, reason="a sandbox has a user id of its own only when dockyard runs as root")
def test_a_shell_that_exits_by_itself_is_replaced_once_its_leftover_processes_are_gone(sandbox):
    """A command that makes the shell exit can leave processes behind that are still dying (a fork bomb's):
    counted against the process cap of the sandbox's user, they would keep the new shell from forking."""
    shell = sandbox.shell()
    assert shell.run("echo up").ok
    # stand-ins for the old shell's dying processes: the sandbox user's, as many as its cap allows
    leftovers = [subprocess.Popen(["setpriv", f"--reuid={sandbox.uid}", f"--regid={sandbox.uid}", "--clear-groups",
                                   "sleep", "300"]) for _ in range(LIMITS.max_processes)]
    # reaped as soon as they die, as the old namespace's init reaps its processes
    for process in leftovers:
        threading.Thread(target=process.wait, daemon=True).start()
    try:
        exited = shell.run("exit 3")
        assert exited.exit_code == 3 and exited.output.endswith("[the shell exited]")
        fresh = shell.run("echo still here")
        assert fresh.ok and fresh.output.splitlines() == ["[the previous shell ended; this is a new shell]", "still here"]
        assert all(process.poll() is not None for process in leftovers)
    finally:
        for process in leftovers:
            process.kill()
            process.wait()


def test_read_only_files_cannot_be_changed_and_do_not_exist_before_they_are_copied(sandbox, tmp_path):
    assert "No such file" in sandbox.run("ls /tests").output
    (tmp_path / "check.sh").write_text("echo checking\n")
    sandbox.copy_in(tmp_path / "check.sh", "/tests/check.sh", read_only=True)
    result = sandbox.run("bash /tests/check.sh; echo tampered >> /tests/check.sh; touch /tests/planted")
    assert result.output.startswith("checking")
    assert "Permission denied" in result.output or "Read-only" in result.output
    assert sandbox.run("cat /tests/check.sh; ls /tests").output.split() == ["echo", "checking", "check.sh"]
    with pytest.raises(SandboxError, match="the sandbox can write"):
        sandbox.copy_in(tmp_path / "check.sh", "/app/check.sh", read_only=True)


def test_copy_out_and_destroy(sandbox, tmp_path):
    sandbox.run("mkdir -p out && echo result > out/r.txt && ln -s /etc/passwd out/link")
    sandbox.copy_out("/app/out/r.txt", tmp_path / "r.txt")
    assert (tmp_path / "r.txt").read_text() == "result\n"
    with pytest.raises(SandboxError, match="does not exist in the sandbox"):
        sandbox.copy_out("/app/out/link", tmp_path / "link")   # a link could point anywhere on the host
    sandbox.destroy()
    if isinstance(sandbox, BubblewrapSandbox):
        assert not sandbox.host_root.exists()
    else:
        assert subprocess.run(["podman", "container", "exists", sandbox.name]).returncode == 1
    with pytest.raises(SandboxError, match="destroyed"):
        sandbox.run("true")


@pytest.mark.skipif(podman_path() is None, reason="podman is not installed (tools/install.sh)")
def test_podman_runs_a_tasks_dockerfile_run_lines_at_creation_and_refuses_missing_images():
    spec = SandboxSpec(workdir="/srv", run=["mkdir -p /opt/tool && echo built > /opt/tool/version", "touch made.txt"])
    with PodmanSandbox(spec, LIMITS) as box:
        assert box.run("cat /opt/tool/version; ls; touch /opt/tool/x").output.splitlines()[:2] == ["built", "made.txt"]
        assert box.run("echo mine > mine.txt && cat mine.txt").output.strip() == "mine"   # the workdir is its user's
    with pytest.raises(SandboxError, match=r"RUN 'exit 3' failed \(3\)"):
        PodmanSandbox(SandboxSpec(run=["exit 3"]), LIMITS)
    with pytest.raises(SandboxError, match="env.sandbox.image: 'dockyard-no-such-image:1' is not in this machine's"):
        SandboxFactory(SandboxConfig(type="podman", image="dockyard-no-such-image:1"))


@needs_bwrap
def test_the_factory_applies_the_config_and_bounds_live_sandboxes():
    config = SandboxConfig(type="bubblewrap", command_exec_timeout_s=5, max_concurrent=1, creation_timeout_s=1,
                           memory_mb=128, max_processes=32)
    assert limits_from(config) == SandboxLimits(command_timeout_s=5, memory_mb=128, max_processes=32)
    factory = SandboxFactory(config)
    first = factory.create(SandboxSpec(workdir=""))
    assert first.workdir == "/rl-sandbox"                     # env.sandbox.working_dir when a task sets none
    with pytest.raises(SandboxError, match="no sandbox slot came free within env.sandbox.creation_timeout_s"):
        factory.create(SandboxSpec())
    first.destroy()
    factory.create(SandboxSpec()).destroy()
    with pytest.raises(SandboxError, match="env.sandbox.memory: not a sandbox setting"):
        SandboxFactory(SandboxConfig(type="bubblewrap", memory=5))
    with pytest.raises(SandboxError, match="env.sandbox.image: bubblewrap .* cannot use the image"):
        SandboxFactory(SandboxConfig(type="bubblewrap", image="ubuntu:24.04"))
    with pytest.raises(SandboxError, match="env.sandbox.type: none runs .* set env.sandbox.trusted: true"):
        SandboxFactory(SandboxConfig(type="none"))
    with pytest.raises(SandboxError, match="env.sandbox.trusted: only type none reads it"):
        SandboxFactory(SandboxConfig(type="bubblewrap", trusted=True))


@pytest.mark.parametrize("backend", BACKENDS)
def test_only_a_task_that_allows_it_gets_the_network(backend):
    with backend(SandboxSpec(network=True), LIMITS) as box:
        # the host's network namespace: its interfaces are visible (no connection is attempted)
        assert "lo" in box.run("ls /sys/class/net 2>/dev/null || cat /proc/net/dev").output
        interfaces = box.run("cat /proc/net/dev | tail -n +3 | cut -d: -f1").output.split()
    with backend(SandboxSpec(), LIMITS) as closed:
        alone = closed.run("cat /proc/net/dev | tail -n +3 | cut -d: -f1").output.split()
    assert set(alone) <= {"lo"} and set(interfaces) - {"lo"}
