"""bubblewrap sandboxes: Linux namespaces around each command, no daemon, no image, no root needed.

What a command sees: the host's /usr and /etc read-only, an empty read-only root otherwise, a fresh
/tmp and /dev/shm of its own (tmpfs sized by tmp_mb and shm_mb; the rest of /dev is read-only), its
own /proc, and the workspace (a host folder of this sandbox, bound at the task's working directory)
as the only writable place that persists. No network (its own empty network namespace; a task that
allows the network gets user-mode networking with this machine closed, network.py), no other
process (its own pid namespace: when the command's shell exits, every process it left behind dies
with the namespace, and a killed command's namespace is waited for), no variables from the trainer.

Files, caps, users and the cgroup: host_folders.py.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import subprocess

from dockyard.sandboxes.base import HOST_CA_BUNDLE
from dockyard.sandboxes.host_folders import HostFolderSandbox
from dockyard.sandboxes.user_namespaces import CONTAINER_CAPS


def bwrap_path() -> str | None:
    return shutil.which("bwrap")


def _pid_namespace(info_fd: int, timeout_s: float = 30.0) -> str | None:
    """bwrap's --info-fd report ({"child-pid": ..., "pid-namespace": ...}) as /proc's ns/pid name."""
    data = b""
    try:
        while select.select([info_fd], [], [], timeout_s)[0] and (chunk := os.read(info_fd, 4096)):
            data += chunk
            try:
                return f"pid:[{json.loads(data)['pid-namespace']}]"
            except (ValueError, KeyError):
                continue
    finally:
        os.close(info_fd)
    return None   # bwrap failed before it set the sandbox up (its error is in the command's output)


IMAGE_SKIPPED = {"/dev", "/proc", "/sys", "/tmp"}   # made fresh for every command


class BubblewrapSandbox(HostFolderSandbox):
    kind = "bubblewrap"
    network_at_hand_over = True   # every command is a fresh process: the verifier's may join a network

    @classmethod
    def refuses(cls, config) -> str | None:
        """Why env.sandbox cannot be served by bubblewrap (checked before anything starts), or None."""
        if bwrap_path() is None:
            return "env.sandbox.type: bubblewrap is not installed here (`apt-get install bubblewrap`)"
        image = getattr(config, "image", None)
        if image:
            return (f"env.sandbox.image: bubblewrap runs commands on this machine's own /usr and cannot use "
                    f"the image {image!r}; set it to null, or use type podman / apptainer / enroot")
        return None

    def wrap(self, argv: list[str], env: dict[str, str], cwd: str | None = None, info_fd: int | None = None) -> list[str]:
        mb = 1024 * 1024
        if self.image_root is not None:   # root of the sandbox's own user namespace, entered by the prefix
            namespaces = ["--unshare-ipc", "--unshare-pid", "--unshare-uts", "--unshare-cgroup-try",
                          *([] if self.network else ["--unshare-net"])]
            caps = ["--cap-drop", "ALL", *[arg for cap in CONTAINER_CAPS for arg in ("--cap-add", cap)]]
        else:
            namespaces = ["--unshare-all", *(["--share-net"] if self.network else [])]
            caps = ["--cap-drop", "ALL"]
        bwrap = ["bwrap", *namespaces, "--die-with-parent", "--new-session", *caps, "--clearenv",
                 *(["--info-fd", str(info_fd)] if info_fd is not None else [])]
        if self.image_root is not None:
            bwrap += ["--bind", str(self.image_root.merged), "/"]
        else:
            bwrap += self._image_root() if self.spec.rootfs else self._host_view()
        for inside, host in self.user_files.items():
            bwrap += ["--ro-bind", str(host), inside]
        if self.network:
            bwrap += ["--ro-bind", str(self.network.resolv), "/etc/resolv.conf"]
        if self.host_ca_bound():
            bwrap += ["--ro-bind", HOST_CA_BUNDLE, HOST_CA_BUNDLE]
        bwrap += ["--dev", "/dev", "--size", str(self.limits.shm_mb * mb), "--tmpfs", "/dev/shm", "--remount-ro", "/dev",
                  "--proc", "/proc", "--size", str(self.limits.tmp_mb * mb), "--tmpfs", "/tmp"]
        for inside, host in sorted(self.mounts.items()):
            bwrap += ["--bind" if self.writable_mount(inside) else "--ro-bind", str(host), inside]
        if self.image_root is None:
            bwrap += ["--remount-ro", "/"]
        bwrap += ["--chdir", cwd or self.workdir]
        for key, value in env.items():
            bwrap += ["--setenv", key, value]
        return [*self.user_and_limits(), *bwrap, "--", *argv]

    @staticmethod
    def _host_view() -> list[str]:
        view = ["--ro-bind", "/usr", "/usr", "--ro-bind", "/etc", "/etc"]
        for link in ("bin", "lib", "lib64", "sbin"):
            if os.path.islink("/" + link):
                view += ["--symlink", os.readlink("/" + link), "/" + link]
            elif os.path.isdir("/" + link):
                view += ["--ro-bind", "/" + link, "/" + link]
        return view

    def _image_root(self) -> list[str]:
        """A built task image's root folder (images.py), each top-level entry read-only: the sandbox's
        own folders (workspace, /tests, /tmp, /dev, /proc) are mounted over it as without an image."""
        view, root = [], self.spec.rootfs
        for entry in sorted(os.listdir(root)):
            inside, path = "/" + entry, os.path.join(root, entry)
            if inside in IMAGE_SKIPPED or inside in self.mounts:
                continue
            if os.path.islink(path):
                view += ["--symlink", os.readlink(path), inside]
            elif os.path.isdir(path) or os.path.isfile(path):
                view += ["--ro-bind", path, inside]
        return view

    def _spawn(self, argv: list[str], env: dict[str, str], cwd: str | None, stdin) -> subprocess.Popen:
        """As the base, and the command's pid namespace is noted (bwrap reports it on --info-fd) so
        that its processes can be ended for certain, root or not."""
        read, write = os.pipe()
        try:
            process = subprocess.Popen(self.wrap(argv, env, cwd, info_fd=write), stdin=stdin, stdout=subprocess.PIPE,
                                       stderr=subprocess.STDOUT, start_new_session=True, env=self._host_env(),
                                       pass_fds=(write,))
        except BaseException:
            os.close(read)
            raise
        finally:
            os.close(write)
        namespace = _pid_namespace(read)
        if namespace:
            self._namespaces[process.pid] = namespace
        return process
