"""The `none` sandbox, for real: commands run on this machine in folders the sandbox makes and
removes, with a clean environment, the caps, the timeouts and the shell of every other kind; no
existing folder is written into, and two sandboxes never share one."""

import secrets
import subprocess
import threading
import time
from pathlib import Path

import pytest

from dockyard.config.schema.env import SandboxConfig
from dockyard.sandboxes.base import SandboxError, SandboxLimits, SandboxSpec
from dockyard.sandboxes.direct import DirectSandbox
from dockyard.sandboxes.factory import SandboxFactory
from dockyard.waiting import wait_until

LIMITS = SandboxLimits(command_timeout_s=20, memory_mb=256, file_size_mb=8, output_bytes=4096)
TRUSTED = SandboxConfig(type="none", trusted=True, creation_timeout_s=5)


def test_commands_run_in_the_tasks_own_folders_which_go_with_the_sandbox(tmp_path, monkeypatch):
    monkeypatch.setenv("DOCKYARD_TRAINER_SECRET", "hunter2")
    (tmp_path / "input.txt").write_text("task input\n")
    workdir, tests = tmp_path / "app", tmp_path / "tests"
    box = SandboxFactory(TRUSTED).create(SandboxSpec(workdir=str(workdir), env={"TASK_VAR": "from the Dockerfile"},
                                                     files=[(tmp_path / "input.txt", f"{workdir}/data/input.txt")]))
    try:
        result = box.run("pwd; cat data/input.txt; echo $TASK_VAR; env")
        assert result.ok, result.output
        lines = result.output.splitlines()
        assert lines[:3] == [str(workdir), "task input", "from the Dockerfile"]
        assert "hunter2" not in result.output and f"HOME={workdir}" in lines
        shell = box.shell()                   # the agent's terminal keeps its directory and variables
        assert shell.run("mkdir sub && cd sub && X=7").ok
        assert shell.run("pwd; echo $X").output.splitlines() == [f"{workdir}/sub", "7"]
        box.copy_in(tmp_path / "input.txt", f"{tests}/input.txt", read_only=True)
        assert box.run(f"cat {tests}/input.txt").output == "task input\n"
        assert box.run("echo made > out.txt").ok
        box.copy_out(f"{workdir}/out.txt", tmp_path / "copied.txt")
        assert (tmp_path / "copied.txt").read_text() == "made\n"
        with pytest.raises(SandboxError, match="not in a folder this sandbox made"):
            box.copy_out(str(tmp_path / "input.txt"), tmp_path / "x")
    finally:
        box.destroy()
    assert not workdir.exists() and not tests.exists()
    assert (tmp_path / "input.txt").exists()             # what it did not make stays


def test_an_existing_folder_is_never_used_or_removed(tmp_path):
    existing = tmp_path / "app"
    existing.mkdir()
    (existing / "keep.txt").write_text("the user's file")
    with pytest.raises(SandboxError, match=f"{existing} already exists on this machine"):
        DirectSandbox(SandboxSpec(workdir=str(existing)), LIMITS, config=TRUSTED)
    with DirectSandbox(SandboxSpec(workdir=str(tmp_path / "ws")), LIMITS, config=TRUSTED) as box:
        with pytest.raises(SandboxError, match=f"{tmp_path} already exists"):
            box.copy_in(existing / "keep.txt", str(tmp_path / "elsewhere.txt"))
    assert (existing / "keep.txt").read_text() == "the user's file"


def test_a_second_sandbox_on_the_same_folder_waits_for_the_first(tmp_path):
    spec = SandboxSpec(workdir=str(tmp_path / "app"))
    first = DirectSandbox(spec, LIMITS, config=TRUSTED)
    first.run("echo first > owner.txt")
    got: list[DirectSandbox] = []
    waiter = threading.Thread(target=lambda: got.append(DirectSandbox(spec, LIMITS, config=TRUSTED)))
    waiter.start()
    time.sleep(0.5)
    assert not got                                       # still waiting: the folder is the first one's
    first.destroy()
    waiter.join(timeout=10)
    (second,) = got
    try:
        assert second.run("ls").output == ""             # a fresh, empty folder, not the first one's files
    finally:
        second.destroy()
    quick = SandboxConfig(type="none", trusted=True, creation_timeout_s=0.5)
    with DirectSandbox(spec, LIMITS, config=TRUSTED):
        with pytest.raises(SandboxError, match="stayed in use by another `none` sandbox .*creation_timeout_s"):
            DirectSandbox(spec, LIMITS, config=quick)


def test_timeouts_kill_the_command_tree_and_caps_hold(tmp_path):
    marker = f"dockyard-direct-{secrets.token_hex(4)}"
    with DirectSandbox(SandboxSpec(workdir=str(tmp_path / "app")), LIMITS, config=TRUSTED) as box:
        result = box.run(f"(sleep 300; echo {marker}) & sleep 300", timeout_s=1)
        assert result.timed_out and result.exit_code is None
        assert wait_until(lambda: marker not in _processes(), timeout_s=10, what="the timed-out command's tree to die")
        big = box.run("head -c 20M /dev/zero > big.bin")
        assert big.exit_code != 0 and (Path(box.workdir) / "big.bin").stat().st_size <= 8 * 1024 * 1024
        memory = box.run("python3 -c 'x = bytearray(512 * 1024 * 1024)'")
        assert memory.exit_code != 0 and "MemoryError" in memory.output
        loud = box.run("yes | head -c 100000")
        assert loud.truncated and len(loud.output) < 5000



def _processes() -> str:
    return subprocess.run(["pgrep", "-af", "dockyard-direct-"], capture_output=True, text=True).stdout
