"""Sandboxes whose every command is a fresh wrapped process (bubblewrap, apptainer, enroot): the
part they share.

The sandbox's files live in host folders: the workspace, bound at the task's working directory, and
one folder per other top-level place files are copied to (`/tests`, `/solution`, `/logs`), bound
where they belong on every command started after the copy, read-only when copied so. Copying in and
out is a host file copy. Each command runs under `prlimit` (the caps) and, when dockyard runs as root,
as a user id of the sandbox's own (from 200000 up, one per live sandbox on the machine, held by a
lock file): the process cap (RLIMIT_NPROC, counted per user) is then per sandbox and root-only host
files stay unreadable; as a normal user it runs as that user.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
from pathlib import Path

from dockyard.sandboxes.base import (Sandbox, SandboxError, SandboxLimits, SandboxSpec, copy_host_path,
                                     kill_user_processes, make_read_only)

FIRST_UID, UIDS = 200_000, 4096
LOCK_DIR = Path(tempfile.gettempdir()) / "dockyard-sandbox-uids"


class UidLease:
    """An exclusive user id for one sandbox, released when the lock file is closed (or the process dies)."""

    def __init__(self):
        LOCK_DIR.mkdir(mode=0o700, exist_ok=True)
        for uid in range(FIRST_UID, FIRST_UID + UIDS):
            handle = open(LOCK_DIR / str(uid), "w")
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                handle.close()
                continue
            self.uid, self._handle = uid, handle
            return
        raise SandboxError(f"all {UIDS} sandbox user ids are taken (lock files in {LOCK_DIR})")

    def release(self) -> None:
        self._handle.close()


class HostFolderSandbox(Sandbox):
    @classmethod
    def refuses(cls, config) -> str | None:
        """Why env.sandbox cannot be served by this kind (checked before anything starts), or None."""
        return None

    def __init__(self, spec: SandboxSpec, limits: SandboxLimits, root: Path | None = None, config=None):
        super().__init__(spec, limits)
        problem = self.refuses(config)
        if problem:
            raise SandboxError(problem)
        self.image = getattr(config, "image", None)
        if not spec.workdir.startswith("/") or spec.workdir == "/":
            raise SandboxError(f"{spec.name}: the working directory must be an absolute folder, not {spec.workdir!r}")
        self.host_root = Path(tempfile.mkdtemp(prefix="dockyard-sandbox-", dir=root))
        self.host_root.chmod(0o711)   # the sandbox's user may pass through to its own folders, not list them
        self.lease = UidLease() if os.geteuid() == 0 else None
        self.uid = self.lease.uid if self.lease else os.geteuid()
        self.gid = self.uid if self.lease else os.getegid()
        self.mounts: dict[str, Path] = {}          # top-level inside folder -> host folder
        self.read_only: set[str] = set()           # mounts the sandbox's user does not own
        self._mount(self.workdir)
        try:
            for source, target in spec.files:
                self.copy_in(source, target)
        except Exception:
            self.destroy()
            raise

    # --- the inside/host path mapping -------------------------------------------------------

    def _mount(self, inside: str, read_only: bool = False) -> Path:
        host = self.host_root / ("mount" + inside.replace("/", "_"))
        host.mkdir(exist_ok=True)
        if read_only:
            self.read_only.add(inside)
        else:
            self._own(host)
        self.mounts[inside] = host
        return host

    def _host_path(self, inside: str, create: bool, read_only: bool = False) -> Path:
        inside = os.path.normpath(inside)
        if not inside.startswith("/"):
            inside = os.path.normpath(os.path.join(self.workdir, inside))
        for mount, host in sorted(self.mounts.items(), key=lambda item: -len(item[0])):
            if inside == mount or inside.startswith(mount + "/"):
                return host / os.path.relpath(inside, mount)
        if not create:
            raise SandboxError(f"{self.spec.name}: {inside} is not in a folder this sandbox can hand out")
        top = "/" + inside.strip("/").split("/")[0]
        if top in ("/usr", "/etc", "/proc", "/dev", "/tmp", "/bin", "/lib", "/lib64", "/sbin"):
            raise SandboxError(f"{self.spec.name}: cannot copy into {inside} (a system folder of the sandbox)")
        return self._mount(top, read_only) / os.path.relpath(inside, top)

    def _own(self, path: Path) -> None:
        if self.lease:
            os.chown(path, self.uid, self.gid)

    def copy_in(self, source: Path, target: str, read_only: bool = False) -> None:
        self._check_alive()
        source = Path(source)
        if not source.exists():
            raise SandboxError(f"{self.spec.name}: {source} does not exist (copying it to {target})")
        destination = self._host_path(target, create=True, read_only=read_only)
        mount = next(m for m, host in self.mounts.items() if destination == host or host in destination.parents)
        if read_only and mount not in self.read_only:
            raise SandboxError(f"{self.spec.name}: {target} is in {mount}, which the sandbox can write; "
                               "read-only files need a folder of their own")
        copy_host_path(source, destination)
        if read_only:
            make_read_only(destination, 0o022)   # root owns it; the sandbox's user is group and other
        elif self.lease:
            for path in [destination, *(destination.rglob("*") if destination.is_dir() else [])]:
                os.lchown(path, self.uid, self.gid)
            parent = destination.parent
            while parent != self.host_root and self.host_root in parent.parents:
                os.chown(parent, self.uid, self.gid)
                parent = parent.parent

    def copy_out(self, source: str, target: Path) -> None:
        self._check_alive()
        host = self._host_path(source, create=False)
        if host.is_symlink() or not host.exists():
            raise SandboxError(f"{self.spec.name}: {source} does not exist in the sandbox (or is a link)")
        copy_host_path(host, Path(target))

    # --- commands ---------------------------------------------------------------------------

    def user_and_limits(self) -> list[str]:
        """The host command prefix: the sandbox's user (as root) and its caps. prlimit is outside the
        wrapper, so the wrapper's own processes and the command count against the caps alike."""
        limits = ["prlimit", *self.limits.prlimit(), "--"]
        user = (["setpriv", f"--reuid={self.uid}", f"--regid={self.gid}", "--clear-groups", "--"]
                if self.lease else [])
        return [*user, *limits]

    def after_shell_ended(self) -> None:
        """The old shell's namespace is going away, but its processes die one by one, still counted
        against the process cap of the sandbox's user; they are its only processes while no other shell
        is open. Without a user of its own (not root) nothing here is the sandbox's alone to kill."""
        if self.lease and not self.live_shells():
            kill_user_processes(self.uid)

    def _teardown(self) -> None:
        shutil.rmtree(self.host_root, ignore_errors=True)
        if self.lease:
            self.lease.release()
