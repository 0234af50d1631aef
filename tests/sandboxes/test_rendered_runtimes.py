"""apptainer and enroot cannot be installed on this machine: their sandboxes' command lines are
checked here (what a cluster that has them runs), and their absence is refused by name."""

import os
import shutil

import pytest

from dockyard.config.schema.env import SandboxConfig
from dockyard.sandboxes import apptainer as runtimes
from dockyard.sandboxes.base import SandboxError, SandboxLimits, SandboxSpec
from dockyard.sandboxes.factory import SandboxFactory

LIMITS = SandboxLimits(memory_mb=512, max_processes=32, file_size_mb=4, cpu_time_s=60)


@pytest.fixture
def installed(monkeypatch):
    """Pretend the runtime binaries are on PATH (only `which` is answered; nothing is run)."""
    real = shutil.which
    monkeypatch.setattr(runtimes.shutil, "which", lambda name: f"/usr/bin/{name}" if name in (
        "apptainer", "enroot") else real(name))


def test_missing_runtimes_and_images_are_refused_by_name():
    if shutil.which("apptainer") is None and shutil.which("singularity") is None:
        with pytest.raises(SandboxError, match="env.sandbox.type: apptainer is not installed here"):
            SandboxFactory(SandboxConfig(type="apptainer", image="/images/tb.sif"))
    if shutil.which("enroot") is None:
        with pytest.raises(SandboxError, match="env.sandbox.type: enroot is not installed here"):
            SandboxFactory(SandboxConfig(type="enroot", image="/images/tb.sqsh"))


def test_apptainer_command_line(installed, tmp_path):
    (tmp_path / "in.txt").write_text("x")
    with pytest.raises(SandboxError, match="env.sandbox.image: an apptainer sandbox needs an image"):
        SandboxFactory(SandboxConfig(type="apptainer"))
    config = SandboxConfig(type="apptainer", image="/images/tb.sif")
    with runtimes.ApptainerSandbox(SandboxSpec(workdir="/app", files=[(tmp_path / "in.txt", "/app/in.txt")],
                                               env={"A": "1"}), LIMITS, config=config) as box:
        box.copy_in(tmp_path / "in.txt", "/tests/in.txt", read_only=True)
        argv = box.wrap(["bash", "-c", "ls"], {"A": "1"})
        start = argv.index("apptainer")
        if os.geteuid() == 0:   # after the sandbox's cgroup (where one can be made): its own user
            user = argv.index("setpriv")
            assert argv[user:user + 4] == ["setpriv", f"--reuid={box.uid}", f"--regid={box.uid}", "--clear-groups"]
        assert "prlimit" in argv[:start] and "--as=536870912" in argv[:start] and "--nproc=32" in argv[:start]
        assert argv[start:start + 11] == ["apptainer", "exec", "--containall", "--cleanenv", "--no-home", "--net",
                                          "--network", "none", "--writable-tmpfs", "--pwd", "/app"]
        assert argv[argv.index("--env") + 1] == "A=1"
        binds = [argv[i + 1] for i, a in enumerate(argv) if a == "--bind"]
        assert binds == [f"{box.mounts['/app']}:/app", f"{box.mounts['/tests']}:/tests:ro"]
        assert argv[-4:] == ["/images/tb.sif", "bash", "-c", "ls"]
        assert (box.mounts["/app"] / "in.txt").read_text() == "x"


def test_enroot_command_lines(installed, monkeypatch):
    config = SandboxConfig(type="enroot", image="/images/tb.sqsh")
    with pytest.raises(SandboxError, match="needs a squashfs image file"):
        SandboxFactory(SandboxConfig(type="enroot", image="docker://ubuntu"))
    created = []
    monkeypatch.setattr(runtimes.EnrootSandbox, "create_command",
                        lambda self: created.append(["enroot", "create", "--name", self.container, self.image]) or ["true"])
    box = runtimes.EnrootSandbox(SandboxSpec(workdir="/work"), LIMITS, config=config)
    try:
        assert created == [["enroot", "create", "--name", box.container, "/images/tb.sqsh"]]
        box.read_only.add("/app")   # as if tests were copied there read-only
        argv = box.wrap(["bash", "-c", "pwd"], {"B": "2"}, cwd="/work/sub")
        if os.geteuid() == 0:
            assert argv[:3] == ["unshare", "--net", "--"]
        start = argv.index("enroot")
        assert argv[start:start + 5] == ["enroot", "start", "--rw", "--env", "B=2"]
        assert argv[argv.index("--mount") + 1] == f"{box.mounts['/work']}:/work:x-create=dir,bind"
        assert argv[argv.index(box.container):] == [box.container, "sh", "-c", 'cd "$1" && shift && exec "$@"',
                                                    "enroot-start", "/work/sub", "bash", "-c", "pwd"]
    finally:
        box.created = False   # nothing to `enroot remove` here
        box.destroy()
