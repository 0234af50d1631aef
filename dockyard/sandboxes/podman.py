"""podman sandboxes: one container per sandbox, commands through `podman exec`.

The container's root is `env.sandbox.image` when set (it must be in the local image store:
`podman pull` or `podman load` it first; nothing is pulled at run time), else the host view that
bubblewrap gives: an empty root with this machine's /usr and /etc bound read-only. Either way:
- no network (`--network none`), no capabilities, no new privileges;
- commands run as a user id of the sandbox's own (the same lease as bubblewrap's), so the image's
  system folders and everything root-owned are read-only to them; the working directory is theirs;
- caps: `--pids-limit` (max_processes), `--memory` (memory_mb, for the whole container, where the
  cgroup memory controller allows it), `--ulimit` for file size, CPU time and open files;
- a task's Dockerfile: COPY/ADD sources are copied in, ENV and WORKDIR set, and its RUN lines run at
  creation, as root, in order, without network (the image build, done in the container: the task's
  base image itself is not pulled). A RUN line that fails fails the sandbox's creation, named.
Files go in and out with `podman cp`. A command past its timeout is killed with every other process
of the sandbox's user in the container (a shell session is restarted on its next command).
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import tempfile
from pathlib import Path

from dockyard.sandboxes.base import Sandbox, SandboxError, SandboxLimits, SandboxSpec, kill_user_processes
from dockyard.sandboxes.host_folders import UidLease

PODMAN = ["podman", "--runtime", "runc"]   # crun is not in every distribution's podman; runc is


def podman_path() -> str | None:
    return shutil.which("podman")


def _podman(*args: str, timeout: float = 120, check: bool = True, input: bytes | None = None) -> subprocess.CompletedProcess:
    result = subprocess.run([*PODMAN, *args], capture_output=True, timeout=timeout, input=input)
    if check and result.returncode != 0:
        raise SandboxError(f"podman {args[0]} failed ({result.returncode}): "
                           f"{result.stderr.decode(errors='replace').strip()[-500:]}")
    return result


class PodmanSandbox(Sandbox):
    kind = "podman"
    builds_images = True

    @classmethod
    def refuses(cls, config) -> str | None:
        if podman_path() is None:
            return "env.sandbox.type: podman is not installed here (`apt-get install podman runc catatonit`)"
        if not (shutil.which("catatonit") or os.path.exists("/usr/libexec/podman/catatonit")):
            return "env.sandbox.type: podman needs catatonit as the containers' init (`apt-get install catatonit`)"
        if config.image and _podman("image", "exists", config.image, check=False).returncode != 0:
            return (f"env.sandbox.image: {config.image!r} is not in this machine's podman image store; "
                    "`podman pull` or `podman load` it first (nothing is pulled while a run starts)")
        return None

    def __init__(self, spec: SandboxSpec, limits: SandboxLimits, config=None):
        super().__init__(spec, limits)
        if podman_path() is None:
            raise SandboxError("podman is not installed (`apt-get install podman`)")
        self.image = getattr(config, "image", None)
        self.name = "dockyard-" + secrets.token_hex(6)
        self.lease = UidLease() if os.geteuid() == 0 else None
        self.uid = self.lease.uid if self.lease else os.geteuid()
        self.root_dir: Path | None = None
        try:
            self._start()
            self._exec_root(f"mkdir -p {_q(self.workdir)} && chown {self.uid}:{self.uid} {_q(self.workdir)}")
            for source, target in spec.files:
                self.copy_in(source, target)
            for line in spec.run:
                result = self._exec_root(line, check=False, cwd=self.workdir)
                if result.returncode != 0:
                    raise SandboxError(f"{spec.name}: the Dockerfile's RUN {line!r} failed ({result.returncode}): "
                                       f"{result.stdout.decode(errors='replace')[-300:]}")
            self._exec_root(f"chown -R {self.uid}:{self.uid} {_q(self.workdir)}")
        except BaseException:
            self._teardown()
            raise

    def _start(self) -> None:
        mb = 1024 * 1024
        limits = ["--pids-limit", str(self.limits.max_processes), "--memory", f"{self.limits.memory_mb}m",
                  "--ulimit", f"fsize={self.limits.file_size_mb * mb}:{self.limits.file_size_mb * mb}",
                  "--ulimit", f"cpu={self.limits.cpu_time_s}:{self.limits.cpu_time_s}",
                  "--ulimit", f"nofile={self.limits.open_files}:{self.limits.open_files}",
                  "--ulimit", f"nproc={self.limits.max_processes}:{self.limits.max_processes}"]
        # --init: catatonit as PID 1 reaps orphans (a killed fork bomb's zombies would hold the pids limit)
        common = ["run", "-d", "--init", "--init-path", shutil.which("catatonit") or "/usr/libexec/podman/catatonit",
                  "--name", self.name, *([] if self.spec.network else ["--network", "none"]), "--cap-drop", "ALL",
                  "--cap-add", "CHOWN,DAC_OVERRIDE,FOWNER,SETUID,SETGID",   # root's set-up steps only
                  "--security-opt", "no-new-privileges", "--tmpfs", "/tmp:rw,mode=1777", *limits]
        for key, value in self.environment().items():
            common += ["--env", f"{key}={value}"]
        if self.image:
            command = [*common, self.image, "sleep", "infinity"]
        else:
            self.root_dir = Path(tempfile.mkdtemp(prefix="dockyard-podman-root-"))
            self.root_dir.chmod(0o755)   # the container's / : its user must pass through it
            for folder in ("usr", "etc", "tmp", "proc", "dev", "sys", "run"):
                (self.root_dir / folder).mkdir()
            for link in ("bin", "lib", "lib64", "sbin"):
                if os.path.islink("/" + link):
                    (self.root_dir / link).symlink_to(os.readlink("/" + link))
            command = [*common, "-v", "/usr:/usr:ro", "-v", "/etc:/etc:ro", "--rootfs", f"{self.root_dir}:O",
                       "sleep", "infinity"]
        result = subprocess.run([*PODMAN, *command], capture_output=True, timeout=120)
        if result.returncode != 0:
            raise SandboxError(f"{self.spec.name}: podman could not start the container: "
                               f"{result.stderr.decode(errors='replace').strip()[-500:]}")

    def _exec_root(self, command: str, check: bool = True, cwd: str = "/") -> subprocess.CompletedProcess:
        result = subprocess.run([*PODMAN, "exec", "--user", "0", "--workdir", cwd, self.name, "sh", "-c", command],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=600)
        if check and result.returncode != 0:
            raise SandboxError(f"{self.spec.name}: {command!r} failed in the container: "
                               f"{result.stdout.decode(errors='replace')[-300:]}")
        return result

    # --- the interface ------------------------------------------------------------------------

    def wrap(self, argv: list[str], env: dict[str, str], cwd: str | None = None) -> list[str]:
        flags = []
        for key, value in env.items():
            flags += ["--env", f"{key}={value}"]
        return [*PODMAN, "exec", "-i", "--user", f"{self.uid}:{self.uid}", "--workdir", cwd or self.workdir, *flags,
                self.name, *argv]

    def on_timeout(self) -> None:
        self._kill_user_processes()

    def after_command(self) -> None:
        """A fresh command's leftovers (background jobs, a fork bomb at the pids limit) end with it, as
        in bubblewrap, unless a shell session is open (its background jobs are the agent's)."""
        if not self.live_shells():
            self._kill_user_processes()

    def after_shell_ended(self) -> None:
        self.after_command()

    def _kill_user_processes(self) -> None:
        """From the host: the sandbox's user id is its own (as root), so its processes are exactly the
        sandbox's; a container at its pids limit could not run a kill itself. As a normal user the
        container is restarted instead (its files stay, its processes go)."""
        if self.lease is None:
            _podman("restart", "-t", "0", self.name, check=False)
            return
        kill_user_processes(self.uid)

    def copy_in(self, source: Path, target: str, read_only: bool = False) -> None:
        self._check_alive()
        source = Path(source)
        if not source.exists():
            raise SandboxError(f"{self.spec.name}: {source} does not exist (copying it to {target})")
        target = os.path.normpath(target if target.startswith("/") else os.path.join(self.workdir, target))
        if read_only and (target == self.workdir or target.startswith(self.workdir.rstrip("/") + "/")):
            # its user owns the working directory, so it could replace a read-only file there
            raise SandboxError(f"{self.spec.name}: {target} is in {self.workdir}, which the sandbox can write; "
                               "read-only files need a folder of their own")
        self._exec_root(f"mkdir -p {_q(os.path.dirname(target.rstrip('/')) or '/')}")
        if source.is_dir():
            self._exec_root(f"mkdir -p {_q(target)}")
            _podman("cp", f"{source}/.", f"{self.name}:{target}")
        else:
            _podman("cp", str(source), f"{self.name}:{target}")
        if read_only:
            self._exec_root(f"chown -R 0:0 {_q(target)} && chmod -R a+rX,go-w {_q(target)}")
        else:
            self._exec_root(f"chown -R {self.uid}:{self.uid} {_q(target)}")

    def copy_out(self, source: str, target: Path) -> None:
        self._check_alive()
        source = source if source.startswith("/") else os.path.join(self.workdir, source)
        kind = self._exec_root(f"test -L {_q(source)} && echo link || (test -e {_q(source)} && echo ok)", check=False)
        if kind.stdout.decode().strip() != "ok":
            raise SandboxError(f"{self.spec.name}: {source} does not exist in the sandbox (or is a link)")
        Path(target).parent.mkdir(parents=True, exist_ok=True)
        _podman("cp", f"{self.name}:{source}", str(target))

    def _teardown(self) -> None:
        _podman("rm", "-f", "-t", "0", self.name, check=False)
        if self.root_dir is not None:
            shutil.rmtree(self.root_dir, ignore_errors=True)
        if self.lease:
            self.lease.release()


def _q(path: str) -> str:
    import shlex

    return shlex.quote(path)
