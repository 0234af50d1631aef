"""Root inside a sandbox, as Terminal-Bench and Harbor tasks expect (their solutions `apt-get install`,
write /usr/local and /etc), without root outside it.

Each such sandbox leases a block of 65536 host user ids (`env.sandbox.root_uid_range`) and gets a user
namespace that maps ids 0-65535 inside onto that block: root inside is an unprivileged id outside, and
every id an image's users have (`_apt`, `nobody`, ...) is one of the block's, so `apt-get`, `su` and
`chown` work as in a container, and the sandbox's processes are exactly those of the block's ids.

The task image's root folder is seen through an idmapped mount (its root-owned files are owned by the
block's first id, i.e. by root inside) under an overlay whose upper folder lives in the sandbox's own
sized tmpfs: whatever the agent writes anywhere goes there and counts against `workspace_mb`, and the
upper folder is, file for file, everything the agent changed, added or removed (`SystemChanges`). The
verifier reads that list before any test runs (grading.py) and can give a path back its image version
(`revert`) while the overlay is down.

Linux 5.19 or later (idmapped mounts under an overlay); dockyard must be root to make the mounts.
"""

from __future__ import annotations

import ctypes
import os
import stat
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from dockyard.sandboxes.base import SandboxError
from dockyard.sandboxes.processes import of_uid_range
from dockyard.sandboxes.users import LOCK_DIR, lease_free

BLOCK = 65536
# root inside gets the capabilities a container's root has by default (Docker's and podman's set, less
# raw sockets and audit), within its own user namespace: over ids of its own block only
CONTAINER_CAPS = ("CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_FSETID", "CAP_KILL", "CAP_SETGID", "CAP_SETUID",
                  "CAP_SETPCAP", "CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_MKNOD", "CAP_SETFCAP")
DEFAULT_ROOT_UIDS = (1_000_000_000, 1_000_000_000 + 64 * BLOCK - 1)   # 64 blocks

_libc = ctypes.CDLL(None, use_errno=True)
SYS_OPEN_TREE, SYS_MOVE_MOUNT, SYS_MOUNT_SETATTR = 428, 429, 442   # the same numbers on x86-64 and arm64
OPEN_TREE_CLONE, OPEN_TREE_CLOEXEC, AT_RECURSIVE, AT_EMPTY_PATH = 1, 0o2000000, 0x8000, 0x1000
MOUNT_ATTR_IDMAP, MOVE_MOUNT_F_EMPTY_PATH, AT_FDCWD = 0x00100000, 0x4, -100
OPAQUE_XATTR = "trusted.overlay.opaque"


class _MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64), ("propagation", ctypes.c_uint64),
                ("userns_fd", ctypes.c_uint64)]


def root_uid_range(config) -> tuple[int, int]:
    value = getattr(config, "root_uid_range", None)
    return (int(value[0]), int(value[1])) if value else DEFAULT_ROOT_UIDS


def root_inside(config, has_image: bool) -> bool:
    """Whether the agent runs as root in its own user namespace (env.sandbox.agent_user; auto: on a built
    task image, when dockyard is root)."""
    choice = getattr(config, "agent_user", "auto")
    if choice == "auto":
        return has_image and os.geteuid() == 0
    return choice == "root"


def root_may_run(config) -> bool:
    """Whether some sandbox of this config may run its agent as root (so podman needs the image's root
    folder exported too)."""
    choice = getattr(config, "agent_user", "auto")
    return choice == "root" or (choice == "auto" and os.geteuid() == 0)


def agent_user_problem(config) -> str | None:
    """Why env.sandbox.agent_user: root cannot be served, or None (checked before anything starts)."""
    choice = getattr(config, "agent_user", "auto")
    if choice == "auto" and getattr(config, "task_images", "host") == "build" and os.geteuid() == 0:
        return root_uid_range_problem(config)
    if choice != "root":
        return None
    if getattr(config, "type", None) not in ("bubblewrap", "podman"):
        return f"env.sandbox.agent_user: root is built for bubblewrap and podman sandboxes, not {config.type}"
    if getattr(config, "task_images", "host") != "build":
        return ("env.sandbox.agent_user: root needs task_images: build (on the host view /usr and /etc are this "
                "machine's own, read-only); set task_images: build, or agent_user: auto / sandbox")
    if os.geteuid() != 0:
        return ("env.sandbox.agent_user: root needs dockyard to run as root (it maps a block of ids into the "
                "sandbox's user namespace and mounts the image's root); use agent_user: auto / sandbox")
    return root_uid_range_problem(config)


def root_uid_range_problem(config) -> str | None:
    """Why env.sandbox.root_uid_range cannot be used here, or None (checked with uid_range's rules)."""
    from dockyard.sandboxes.users import ids_in_use

    first, last = root_uid_range(config)
    blocks = (last - first + 1) // BLOCK
    if first <= 0 or last >= 2 ** 32 - 1 or blocks < 1:
        return (f"env.sandbox.root_uid_range: [{first}, {last}] must hold at least one block of {BLOCK} user ids "
                "above 0 and below 4294967295")
    taken = ids_in_use(first, first + blocks * BLOCK - 1)
    if taken:
        return (f"env.sandbox.root_uid_range: [{first}, {last}] overlaps ids this machine uses: "
                f"{', '.join(taken[:5])}; choose a range nobody has")
    return None


class UidBlockLease:
    """An exclusive block of 65536 host ids from [first, last] for one sandbox whose agent is root inside,
    released when its lock file closes. A block whose lock is free but whose ids still run processes (a
    dead trainer's sandbox) is handed out only once they are gone."""

    def __init__(self, first: int, last: int):
        blocks = range(first, last - BLOCK + 2, BLOCK)
        self.base, self._handle = lease_free(
            ((base, f"block-{base}", of_uid_range(base, base + BLOCK - 1)) for base in blocks), "sandbox ids",
            f"all {len(blocks)} blocks of env.sandbox.root_uid_range [{first}, {last}] are taken (one per sandbox "
            f"whose agent is root; lock files in {LOCK_DIR})")
        self.uid = self.base   # root inside is the first id outside

    def release(self) -> None:
        self._handle.close()


def in_new_namespace(child: subprocess.Popen, kind: str, timeout_s: float, what: str) -> None:
    """Wait until `child` (a command that unshares, then sleeps) is in a `kind` namespace other than
    this process's; SandboxError naming `what` if it exits or the time runs out first."""
    own = os.readlink(f"/proc/self/ns/{kind}")
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if os.readlink(f"/proc/{child.pid}/ns/{kind}") != own:
                return
        except OSError:
            pass
        if child.poll() is not None or time.monotonic() > deadline:
            why = child.stderr.read().decode(errors="replace").strip()[-300:] if child.poll() is not None else \
                f"none after {timeout_s:.0f} s"
            raise SandboxError(f"could not make {what}: {why}")
        time.sleep(0.002)


def root_lease(spec, config) -> tuple[UidBlockLease, "UserNamespace"]:
    """A root-inside sandbox's block of ids and its user namespace (its task must have a built image)."""
    if spec.rootfs is None:
        raise SandboxError(f"{spec.name}: env.sandbox.agent_user root needs the task's built image "
                           "(env.sandbox.task_images: build)")
    lease = UidBlockLease(*root_uid_range(config))
    try:
        return lease, UserNamespace(lease.uid)
    except BaseException:
        lease.release()
        raise


class UserNamespace:
    """A user namespace mapping ids 0-65535 onto [base, base + 65535], kept alive by a file descriptor of
    this process (no process of its own): commands enter it with `enter_prefix()`."""

    def __init__(self, base: int, timeout_s: float = 10.0):
        child = subprocess.Popen(["unshare", "--user", "--", "sleep", "60"], stdin=subprocess.DEVNULL,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            in_new_namespace(child, "user", timeout_s, "a user namespace for the sandbox")
            for name, text in (("uid_map", f"0 {base} {BLOCK}\n"), ("setgroups", "allow"), ("gid_map", f"0 {base} {BLOCK}\n")):
                with open(f"/proc/{child.pid}/{name}", "w") as out:
                    out.write(text)
            self.fd = os.open(f"/proc/{child.pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
        except OSError as err:
            raise SandboxError(f"could not map ids {base}+ into the sandbox's user namespace: {err}") from None
        finally:
            child.kill()
            child.wait()
        self.base = base

    @property
    def path(self) -> str:
        return f"/proc/{os.getpid()}/fd/{self.fd}"

    def enter_prefix(self) -> list[str]:
        """argv prefix (run as root): the command becomes root of this namespace (the block's first id)."""
        return ["nsenter", f"--user={self.path}", "--setuid", "0", "--setgid", "0", "--"]

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def idmapped_mount(source: Path, target: Path, namespace: UserNamespace) -> None:
    """A recursive bind of `source` at `target` whose files' owners are shifted into the namespace's block
    (on-disk 0 is the block's first id): root inside owns what root owned in the image."""
    fd = _libc.syscall(SYS_OPEN_TREE, AT_FDCWD, str(source).encode(), OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_RECURSIVE)
    if fd < 0:
        raise SandboxError(f"could not clone the mount of {source}: {os.strerror(ctypes.get_errno())}")
    try:
        attr = _MountAttr(MOUNT_ATTR_IDMAP, 0, 0, namespace.fd)
        if _libc.syscall(SYS_MOUNT_SETATTR, fd, b"", AT_EMPTY_PATH | AT_RECURSIVE, ctypes.byref(attr),
                         ctypes.sizeof(attr)) < 0:
            raise SandboxError(f"could not idmap {source} for the sandbox's user namespace (needs Linux 5.12+ and a "
                               f"file system that supports it): {os.strerror(ctypes.get_errno())}")
        if _libc.syscall(SYS_MOVE_MOUNT, fd, b"", AT_FDCWD, str(target).encode(), MOVE_MOUNT_F_EMPTY_PATH) < 0:
            raise SandboxError(f"could not mount {source} at {target}: {os.strerror(ctypes.get_errno())}")
    finally:
        os.close(fd)


def _mount_overlay(lower: Path, upper: Path, work: Path, target: Path) -> None:
    options = f"lowerdir={lower},upperdir={upper},workdir={work}"
    if _libc.mount(b"dockyard-root", str(target).encode(), b"overlay", 0, options.encode()) != 0:
        raise SandboxError(f"could not mount the sandbox's root overlay at {target} (needs Linux 5.19+ for an "
                           f"idmapped lower folder): {os.strerror(ctypes.get_errno())}")


def _unmount(path: Path) -> None:
    _libc.umount2(str(path).encode(), 2)   # MNT_DETACH


@dataclass
class Change:
    path: str        # inside, absolute
    kind: str        # "added", "changed" (an image file replaced or its metadata changed), "removed"
    is_dir: bool = False


@dataclass
class SystemChanges:
    """What the agent did to the image's root, read from the overlay's upper folder; both folders are
    host folders the verifier reads directly (never through the agent's sandbox)."""

    changes: list[Change]
    image: Path       # the image's root folder
    upper: Path       # the agent's changes

    def image_has(self, path: str) -> bool:
        return os.path.lexists(os.path.join(self.image, path.lstrip("/")))

    def agent_file(self, path: str) -> Path:
        """The host path of a file the agent added or changed (read it without following links)."""
        return self.upper / path.lstrip("/")

    def paths(self) -> set[str]:
        return {c.path for c in self.changes}

    def wrote(self, path: str) -> bool:
        """Whether the agent made or changed `path` (or a folder it lies in was made or replaced)."""
        path = os.path.normpath(path)
        return any(c.kind != "removed" and (path == c.path or (c.is_dir and c.kind == "added"
                                                                and path.startswith(c.path.rstrip("/") + "/")))
                   for c in self.changes)


class ImageRoot:
    """The task image's root folder as a writable root for one sandbox: idmapped lower, overlay upper in
    `folder` (the sandbox's tmpfs). `merged` is what commands bind at /."""

    def __init__(self, rootfs: Path, folder: Path, namespace: UserNamespace):
        self.rootfs = Path(rootfs)
        self.lower, self.upper, self.work, self.merged = (folder / n for n in ("image", "upper", "work", "root"))
        self.mounted: list[Path] = []
        for each in (self.lower, self.upper, self.work, self.merged):
            each.mkdir(mode=0o700)
        base = namespace.base
        root_mode = stat.S_IMODE(os.stat(self.rootfs).st_mode)
        for each in (self.upper, self.work):
            os.chown(each, base, base)
        self.upper.chmod(root_mode)
        idmapped_mount(self.rootfs, self.lower, namespace)
        self.mounted.append(self.lower)
        self.mount()

    def mount(self) -> None:
        _mount_overlay(self.lower, self.upper, self.work, self.merged)
        self.mounted.append(self.merged)

    def unmount_overlay(self) -> None:
        if self.merged in self.mounted:
            _unmount(self.merged)
            self.mounted.remove(self.merged)

    def changes(self) -> SystemChanges:
        """Every entry of the upper folder: a whiteout (character device 0/0) is a removal, an opaque
        folder replaced the image's, anything else was added or changed (the image has it or not)."""
        found = []
        for folder, dirs, files in os.walk(self.upper):
            inside_folder = "/" + os.path.relpath(folder, self.upper).lstrip(".").lstrip("/")
            for name in dirs + files:
                host = os.path.join(folder, name)
                inside = os.path.normpath(os.path.join(inside_folder, name))
                info = os.lstat(host)
                in_image = os.path.lexists(os.path.join(self.rootfs, inside.lstrip("/")))
                if stat.S_ISCHR(info.st_mode) and info.st_rdev == 0:
                    found.append(Change(inside, "removed", os.path.isdir(os.path.join(self.rootfs, inside.lstrip("/")))))
                    continue
                is_dir = stat.S_ISDIR(info.st_mode)
                if is_dir and in_image and not _opaque(host):
                    continue   # a folder of the image that holds changes: they are listed themselves
                found.append(Change(inside, "changed" if in_image else "added", is_dir))
        return SystemChanges(sorted(found, key=lambda c: c.path), self.rootfs, self.upper)

    def revert(self, paths: list[str]) -> None:
        """Give each path its image state back (a change or removal undone, an addition gone): its upper
        entry is removed while the overlay is down (an overlay's layers must not change under it)."""
        self.unmount_overlay()
        try:
            for inside in paths:
                host = self.upper / inside.lstrip("/")
                if not os.path.lexists(host):
                    continue
                if os.path.isdir(host) and not os.path.islink(host):
                    subprocess.run(["rm", "-rf", "--one-file-system", str(host)], check=True, timeout=300)
                else:
                    host.unlink()
        finally:
            self.mount()

    def close(self) -> None:
        for path in reversed(self.mounted):
            _unmount(path)
        self.mounted.clear()


def _opaque(path: str) -> bool:
    try:
        return os.getxattr(path, OPAQUE_XATTR, follow_symlinks=False) == b"y"
    except OSError:
        return False
