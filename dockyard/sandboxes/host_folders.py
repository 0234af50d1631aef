"""Sandboxes whose every command is a fresh wrapped process (bubblewrap, apptainer, enroot): the part they share.

The sandbox's files live in host folders under one root of its own: the workspace, bound at the task's
working directory, and one folder per other top-level place files are copied to (`/tests`, `/solution`,
`/logs`; a file copied to a top-level path, `COPY data.csv /data.csv`, is bound there on its own), bound
where they belong on every command started after the copy, read-only when copied so.
As root that root is a tmpfs sized by `workspace_mb` and `workspace_inodes`, so the agent's files
together are capped, not only each one. Copies in and out are host copies that never follow a link
(host_paths.py).

Who runs the commands: as root, the agent's commands run as a user id of the sandbox's own (leased
from `env.sandbox.uid_range`, users.py): the process
cap (RLIMIT_NPROC, counted per user) is then per sandbox, root-only host files stay unreadable, and
the sandbox's processes are exactly that user's, so they can be ended for certain. At `hand_over`
the verifier gets a second user id, and the workspace changes hands to it. As a normal user every
command runs as that user; the processes are then found by the pid namespaces their commands ran in.

Also as root: a cgroup per sandbox caps the memory of all its processes (`sandbox_memory_mb`, where
the memory controller is writable), and a task that allows the network gets one of its own
(network.py). Everything a sandbox makes on the host carries its trainer's owner token, so a trainer
that starts can reap what a dead one left (reaping.py).
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from dockyard.sandboxes import host_paths
from dockyard.sandboxes.base import HOST_CA_BUNDLE, Sandbox, SandboxError, SandboxLimits, SandboxSpec
from dockyard.sandboxes.cgroups import SandboxCgroup
from dockyard.sandboxes.network import UserNetwork
from dockyard.sandboxes.owners import owner_token
from dockyard.sandboxes.processes import any_of, end_processes, in_pid_namespaces, of_uid_range, of_user
from dockyard.sandboxes.user_namespaces import BLOCK, ImageRoot, SystemChanges, UserNamespace, root_inside, \
    root_lease
from dockyard.sandboxes.users import UidLease, uid_range, with_user_entries

FOLDER_PREFIX = "dockyard-sandbox-"
SYSTEM_FOLDERS = ("/usr", "/etc", "/proc", "/dev", "/tmp", "/bin", "/lib", "/lib64", "/sbin")
BUILD_HINT = "env.sandbox.task_images: build runs a task on its own image, where its Dockerfile may write anywhere"

_libc = ctypes.CDLL(None, use_errno=True)
MNT_DETACH = 2


def mount_tmpfs(folder: Path, limits: SandboxLimits) -> None:
    """A tmpfs of workspace_mb and workspace_inodes at `folder` (mount(2) itself: a `mount` process
    per sandbox would cost more than the sandbox's own start)."""
    options = f"size={limits.workspace_mb}m,nr_inodes={limits.workspace_inodes},mode=0711"
    if _libc.mount(b"dockyard-sandbox", str(folder).encode(), b"tmpfs", 0, options.encode()) != 0:
        raise SandboxError(f"could not mount the sandbox's tmpfs at {folder}: {os.strerror(ctypes.get_errno())}")


def unmount(folder: Path) -> None:
    _libc.umount2(str(folder).encode(), MNT_DETACH)


MS_REMOUNT = 32
VERIFIER_ROOM_MB, VERIFIER_ROOM_INODES = 64, 4096


def give_verifier_room(folder: Path, limits: SandboxLimits) -> None:
    """The tmpfs grows by a little at the hand-over: an agent that filled its workspace (bytes or files)
    must not leave the verifier without room for its records and the reward file."""
    options = (f"size={limits.workspace_mb + VERIFIER_ROOM_MB}m,"
               f"nr_inodes={limits.workspace_inodes + VERIFIER_ROOM_INODES}")
    if _libc.mount(b"dockyard-sandbox", str(folder).encode(), b"tmpfs", MS_REMOUNT, options.encode()) != 0:
        raise SandboxError(f"could not give the verifier room in {folder}: {os.strerror(ctypes.get_errno())}")


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
        self.uids = uid_range(config)
        as_root = os.geteuid() == 0
        self.host_root = Path(tempfile.mkdtemp(prefix=f"{FOLDER_PREFIX}{owner_token()}-", dir=root))
        self.mounted = False
        self.lease = self.verifier_lease = None
        self.cgroup: SandboxCgroup | None = None
        self.network: UserNetwork | None = None
        self._namespaces: dict[int, str] = {}      # host pid of a command -> the pid namespace it runs in
        self.mounts: dict[str, Path] = {}          # top-level inside folder (or file) -> host folder (or file)
        self.file_mounts: set[str] = set()         # the mounts that are files (_mount_file)
        self.read_only: set[str] = set()           # mounts the sandbox's user does not own
        self.verifier_owned: set[str] = set()      # read-only mounts handed to the verifier to write (/tests)
        self.user_files: dict[str, Path] = {}      # /etc/passwd, /etc/group with the sandbox's users (as root)
        self.agent_folders: list[str] | None = None   # what the agent could write, fixed at the hand-over
        self.root_inside = as_root and root_inside(config, spec.rootfs is not None)
        self.namespace: UserNamespace | None = None
        self.image_root: ImageRoot | None = None   # the image's root, writable by root inside (root_inside)
        try:
            if as_root:
                mount_tmpfs(self.host_root, limits)
                self.mounted = True
            self.host_root.chmod(0o711)   # the sandbox's user may pass through to its own folders, not list them
            if self.root_inside:   # user_namespaces.py: root inside is the block's first id outside
                self.lease, self.namespace = root_lease(spec, config)
            else:
                self.lease = UidLease(*self.uids) if as_root else None
            self.uid = self.lease.uid if self.lease else os.geteuid()
            self.gid = self.uid if self.lease else os.getegid()
            if as_root:
                self.cgroup = SandboxCgroup.create(self.host_root.name, limits.sandbox_memory_mb * 1024 * 1024)
            if spec.network:
                self.network = UserNetwork(spec.name)
            if self.root_inside:
                self.image_root = ImageRoot(spec.rootfs, self.host_root, self.namespace)
            elif self.lease:
                self._write_user_files()
            workspace = self._mount(self.workdir)
            if spec.rootfs is not None:   # a built image's files at the working directory are the agent's
                image_files = Path(spec.rootfs) / self.workdir.lstrip("/")
                if image_files.is_dir() and not image_files.is_symlink():
                    host_paths.copy_in(image_files, workspace, "", (self.uid, self.gid) if self.lease else None)
            for source, target in spec.files:
                self.copy_in(source, target)
        except BaseException:
            self.destroy()
            raise

    # --- the inside/host path mapping -------------------------------------------------------

    def _mount(self, inside: str, read_only: bool = False) -> Path:
        host = self.host_root / ("mount" + inside.replace("/", "_"))
        host.mkdir(exist_ok=True)
        if read_only:
            self.read_only.add(inside)
        elif self.lease:
            os.chown(host, self.uid, self.gid)
        self.mounts[inside] = host
        return host

    def _mount_file(self, inside: str, read_only: bool) -> Path:
        """A file at a top-level path (`COPY data.csv /data.csv`): bound there on its own, as Docker places
        it (a folder mount made it a folder holding the file). Its host path, in the sandbox's root."""
        host = self.host_root / ("file" + inside.replace("/", "_"))
        if read_only:
            self.read_only.add(inside)
        self.mounts[inside] = host
        self.file_mounts.add(inside)
        return host

    def _locate(self, inside: str, create: bool, read_only: bool = False,
                is_file: bool = False) -> tuple[str, Path, str]:
        """(the mount holding `inside`, its host folder, the path below it); `is_file`: what is copied to
        `inside` is a file, which gets a mount of its own at a top-level path."""
        inside = os.path.normpath(inside if inside.startswith("/") else os.path.join(self.workdir, inside))
        for mount, host in sorted(self.mounts.items(), key=lambda item: -len(item[0])):
            if mount in self.file_mounts and inside == mount:
                return mount, host.parent, host.name
            if inside == mount or inside.startswith(mount + "/"):
                return mount, host, os.path.relpath(inside, mount)
        if not create:
            raise SandboxError(f"{self.spec.name}: {inside} is not in a folder this sandbox can hand out")
        top = "/" + inside.strip("/").split("/")[0]
        if top in SYSTEM_FOLDERS:
            raise SandboxError(f"{self.spec.name}: cannot copy into {inside} (a system folder of the sandbox)"
                               + ("" if self.spec.rootfs else f"; {BUILD_HINT}"))
        if is_file and inside == top:
            host = self._mount_file(top, read_only)
            return top, host.parent, host.name
        return top, self._mount(top, read_only), os.path.relpath(inside, top)

    def copy_in(self, source: Path, target: str, read_only: bool = False) -> None:
        self._check_alive()
        source = Path(source)
        if not source.exists():
            raise SandboxError(f"{self.spec.name}: {source} does not exist (copying it to {target})")
        mount, host, relative = self._locate(target, create=True, read_only=read_only, is_file=not source.is_dir())
        if read_only and mount not in self.read_only:
            raise SandboxError(f"{self.spec.name}: {target} is in {mount}, which the sandbox can write; "
                               "read-only files need a folder of their own")
        owner = None if read_only or not self.lease else (self.uid, self.gid)
        try:
            host_paths.copy_in(source, host, "" if relative == "." else relative, owner,
                               clear_bits=0o022 if read_only else 0)
        except SandboxError as err:
            raise SandboxError(f"{self.spec.name}: copying to {target}: {err}") from None

    def copy_out(self, source: str, target: Path, links: bool = False) -> None:
        self._check_alive()
        _, host, relative = self._locate(source, create=False)
        host_paths.copy_out(host, "" if relative == "." else relative, Path(target), f"{self.spec.name}: {source}",
                            links)

    def agent_writable(self) -> list[str]:
        """The agent's folders: those writable when it handed over (a folder made for the verifier
        after that, such as its HOME, was never the agent's)."""
        if self.agent_folders is not None:
            return list(self.agent_folders)
        return [*[m for m in self.mounts if m not in self.read_only], "/tmp", "/dev/shm"]

    def writable_host_folders(self) -> dict[str, Path]:
        return {inside: host for inside, host in self.mounts.items()
                if inside not in self.read_only and inside not in self.file_mounts}

    def host_ca_bound(self) -> bool:
        """With a network and an image, this machine's CA bundle is bound over the image's."""
        return self.network is not None and self.spec.rootfs is not None and os.path.isfile(HOST_CA_BUNDLE) \
            and os.path.isfile(os.path.join(self.spec.rootfs, HOST_CA_BUNDLE.lstrip("/")))

    def _write_user_files(self) -> None:
        """/etc/passwd and /etc/group as the sandbox's root has them (the image's or this machine's),
        with an entry for each of the sandbox's users; bound over the originals on every command."""
        root = Path(self.spec.rootfs) if self.spec.rootfs else Path("/")
        texts = []
        for name in ("passwd", "group"):
            try:
                texts.append((root / "etc" / name).read_text(errors="replace"))
            except OSError:
                texts.append("")
        users = [("sandbox", self.lease.uid, self.workdir)]
        if self.verifier_lease:
            users.append(("verifier", self.verifier_lease.uid, "/"))
        for name, text in zip(("passwd", "group"), with_user_entries(*texts, users)):
            path = self.host_root / f"etc-{name}"
            with open(path, "w") as out:   # in place: a bind of the file sees the new text
                out.write(text)
            path.chmod(0o644)
            self.user_files[f"/etc/{name}"] = path

    def _open_to_verifier(self, folder: str) -> None:
        host = self.mounts.get(folder)
        if host is None or folder not in self.read_only:
            raise SandboxError(f"{self.spec.name}: {folder} is not a read-only folder placed for the verifier")
        if self.lease:
            host_paths.chown_tree(host, (self.uid, self.gid))
        subprocess.run(["chmod", "-R", "u+w", str(host)], check=True, capture_output=True, timeout=600)
        self.verifier_owned.add(folder)

    def writable_mount(self, inside: str) -> bool:
        """Whether commands get `inside` read-write: the agent's folders, and those opened to the verifier."""
        return inside not in self.read_only or inside in self.verifier_owned

    # --- commands ---------------------------------------------------------------------------

    def user_and_limits(self) -> list[str]:
        """The host command prefix: the sandbox's cgroup and network (as root), its user and its caps.
        prlimit is outside the wrapper, so the wrapper's own processes and the command count against
        the caps alike."""
        prefix = [*(self.cgroup.join_prefix() if self.cgroup else []),
                  *(self.network.enter_prefix() if self.network else [])]
        if self.namespace:
            prefix += self.namespace.enter_prefix()
        elif self.lease:
            prefix += ["setpriv", f"--reuid={self.uid}", f"--regid={self.gid}", "--clear-groups", "--"]
        return [*prefix, "prlimit", *self.limits.prlimit(sandbox_capped=self.cgroup is not None), "--"]

    def end_processes(self) -> None:
        """As root: every process of the sandbox's users; either way: every process in the pid
        namespaces its commands ran in."""
        selectors = [self._own_ids()]
        if self._namespaces:
            selectors.append(in_pid_namespaces(set(self._namespaces.values())))
        end_processes(any_of(*selectors), f"{self.spec.name} ({self.kind} sandbox)")
        self._namespaces.clear()

    def _finished(self, process: subprocess.Popen, killed: bool, shell: bool) -> None:
        """A killed command's namespace dies with it, but not at once: its processes are waited for. A
        shell that exited by itself may have left dying processes (a fork bomb's), still counted against
        the process cap of the sandbox's user; as root they are its only processes while no other shell
        is open, so they go before a new shell starts."""
        namespace = self._namespaces.pop(process.pid, None)
        if namespace and (killed or shell):
            end_processes(in_pid_namespaces({namespace}), f"{self.spec.name} ({self.kind} sandbox)")
        if shell and not killed and self.lease and not self.live_shells():
            end_processes(self._own_ids(), f"{self.spec.name} ({self.kind} sandbox)")

    def _own_ids(self):
        """The processes of the sandbox's users: its leased ids, or its whole block with root inside."""
        if self.root_inside and self.lease:
            return of_uid_range(self.lease.uid, self.lease.uid + BLOCK - 1)
        return of_user(*[lease.uid for lease in (self.lease, self.verifier_lease) if lease is not None])

    def _become_verifier(self) -> None:
        self.agent_folders = self.agent_writable()
        if self.mounted:
            give_verifier_room(self.host_root, self.limits)
        if self.lease is None:
            return   # a normal user has no second user id to give the verifier (docs/agents.md)
        if self.spec.verifier_network and self.network is None and self.network_at_hand_over:
            self.network = UserNetwork(self.spec.name)   # the tests' network, never the agent's
        if self.root_inside:
            return   # the tests run as root inside too (as Harbor's); every process of the agent's ids is gone
        self.verifier_lease = UidLease(*self.uids)
        self.uid = self.gid = self.verifier_lease.uid
        self._write_user_files()
        for mount, host in self.mounts.items():
            if mount not in self.read_only:
                host_paths.chown_tree(host, (self.uid, self.gid))

    # --- root inside: the image's root and what the agent changed in it ------------------------

    def system_changes(self) -> SystemChanges | None:
        """As the base; the sandbox's own mount points (made by bubblewrap in the overlay) are not changes."""
        if self.image_root is None:
            return None
        changes = self.image_root.changes()
        own = {*self.mounts, *self.user_files, "/dev", "/proc", "/tmp", "/etc/resolv.conf", HOST_CA_BUNDLE}

        def mount_point(change) -> bool:
            if change.kind != "added":
                return False
            if change.is_dir:
                return any(m == change.path or m.startswith(change.path.rstrip("/") + "/") for m in own)
            return change.path in own and os.lstat(changes.agent_file(change.path)).st_size == 0
        changes.changes = [c for c in changes.changes if not mount_point(c)]
        return changes

    def revert_system(self, paths: list[str]) -> None:
        if self.image_root and paths:
            self.image_root.revert(paths)

    def _teardown(self) -> None:
        if self.network is not None:
            self.network.close()
        if self.image_root is not None:
            self.image_root.close()
        if self.namespace is not None:
            self.namespace.close()
        if self.mounted:
            unmount(self.host_root)
        shutil.rmtree(self.host_root, ignore_errors=True)
        if self.cgroup is not None:
            self.cgroup.remove()
        for lease in (self.lease, self.verifier_lease):
            if lease is not None:
                lease.release()
