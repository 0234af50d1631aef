"""The `none` sandbox: a task's commands run straight on this machine as the trainer's user, with no
isolation. It is for a trainer that already runs inside something disposable (a job container whose
runtime forbids nested namespaces, a throw-away VM) and is refused unless `env.sandbox.trusted` says
so.

What stays from the other kinds: the clean environment (no variable of the trainer's), the caps
(`prlimit`), the per-command timeout with the kill of the command's process group, the output cap,
the persistent shell. What goes: everything else. A command can reach the network whatever the task
says, read and write whatever the trainer's user can, and a process that leaves its session
(`setsid`) outlives its command; read-only copies are file modes only (root ignores them).

A task's paths are the machine's own paths: its working directory and the top-level folders files
are copied to (`/tests`, `/solution`, `/logs`) are made where the task says. So that no existing
folder is written into or removed, a sandbox only makes folders that do not exist yet, holds them
while it lives (another sandbox of this process that needs one waits for it) and removes them when
destroyed.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from pathlib import Path

from dockyard.sandboxes import host_paths
from dockyard.sandboxes.base import (Sandbox, SandboxError, SandboxLimits, SandboxSpec, copy_host_path,
                                     make_read_only)

_held: set[str] = set()                 # folders a live sandbox of this process made and holds
_held_changed = threading.Condition()


class DirectSandbox(Sandbox):
    kind = "none"

    @classmethod
    def refuses(cls, config) -> str | None:
        if not getattr(config, "trusted", False):
            return ("env.sandbox.type: none runs the policy's commands on this machine with no isolation; set "
                    "env.sandbox.trusted: true to accept that (only where the trainer itself runs in something "
                    "disposable), or use bubblewrap / podman")
        return None

    def __init__(self, spec: SandboxSpec, limits: SandboxLimits, config=None):
        super().__init__(spec, limits)
        problem = self.refuses(config)
        if problem:
            raise SandboxError(problem)
        if not spec.workdir.startswith("/") or spec.workdir == "/":
            raise SandboxError(f"{spec.name}: the working directory must be an absolute folder, not {spec.workdir!r}")
        self.wait_s = getattr(config, "creation_timeout_s", 600.0)
        self.made: list[Path] = []
        try:
            self._claim(Path(os.path.normpath(spec.workdir)))
            for source, target in spec.files:
                self.copy_in(source, target)
        except BaseException:
            self.destroy()
            raise

    def _claim(self, folder: Path) -> Path:
        """Make `folder` (it must not exist) and hold it until this sandbox is destroyed."""
        key = str(folder)
        deadline = time.monotonic() + self.wait_s
        with _held_changed:
            while key in _held:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise SandboxError(f"{self.spec.name}: {folder} stayed in use by another `none` sandbox for "
                                       f"{self.wait_s:.0f} s (env.sandbox.creation_timeout_s)")
                _held_changed.wait(timeout=remaining)
            if folder.exists() or folder.is_symlink():
                raise SandboxError(f"{self.spec.name}: {folder} already exists on this machine; a `none` sandbox "
                                   "only makes folders of its own (remove it, or give the task another path)")
            folder.mkdir(parents=True)
            _held.add(key)
        self.made.append(folder)
        return folder

    def _real(self, inside: str) -> Path:
        return Path(os.path.normpath(inside if inside.startswith("/") else os.path.join(self.workdir, inside)))

    def _holds(self, path: Path) -> bool:
        return any(path == made or made in path.parents for made in self.made)

    def _place(self, inside: str, folder: bool) -> Path:
        """The real path of `inside`; outside every folder held, the first of its folders that does not
        exist yet is made and held (a file may not land in a folder this sandbox did not make)."""
        path = self._real(inside)
        if self._holds(path):
            return path
        missing = next((p for p in [*reversed(path.parents), path] if not p.exists() and not p.is_symlink()), None)
        if missing is None or missing == path and not folder:
            raise SandboxError(f"{self.spec.name}: {missing.parent if missing else path} already exists on this "
                               f"machine; a `none` sandbox only places files in folders it makes ({inside})")
        self._claim(missing)
        return path

    def wrap(self, argv: list[str], env: dict[str, str], cwd: str | None = None) -> list[str]:
        return ["prlimit", *self.limits.prlimit(sandbox_capped=False), "--", "env", "-i", f"--chdir={cwd or self.workdir}",
                *(f"{key}={value}" for key, value in env.items()), *argv]

    def copy_in(self, source: Path, target: str, read_only: bool = False) -> None:
        self._check_alive()
        source = Path(source)
        if not source.exists():
            raise SandboxError(f"{self.spec.name}: {source} does not exist (copying it to {target})")
        destination = self._place(target, folder=source.is_dir())
        copy_host_path(source, destination)
        if read_only:
            make_read_only(destination, 0o222)   # the commands run as the files' owner

    def copy_out(self, source: str, target: Path, links: bool = False) -> None:
        self._check_alive()
        path = self._real(source)
        if not self._holds(path):
            raise SandboxError(f"{self.spec.name}: {source} is not in a folder this sandbox made")
        host_paths.copy_out(Path("/"), str(path), Path(target), f"{self.spec.name}: {source}", links)

    def _teardown(self) -> None:
        with _held_changed:
            for folder in reversed(self.made):
                for path in [folder, *folder.rglob("*")]:   # read-only copies must be removable
                    if path.is_dir() and not path.is_symlink():
                        path.chmod(0o700)
                shutil.rmtree(folder, ignore_errors=True)
                _held.discard(str(folder))
            self.made = []
            _held_changed.notify_all()
