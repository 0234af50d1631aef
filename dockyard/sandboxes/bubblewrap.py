"""bubblewrap sandboxes: Linux namespaces around each command, no daemon, no image, no root needed.

What a command sees: the host's /usr and /etc read-only, an empty read-only root otherwise, a fresh
/tmp, /dev and /proc of its own, and the workspace (a host folder of this sandbox, bound at the
task's working directory) as the only writable place that persists. No network (its own empty
network namespace), no other process (its own pid namespace; when the command's shell exits,
every process it left behind dies with the namespace), no variables from the trainer.

Files, caps and the sandbox's own user id: host_folders.py.
"""

from __future__ import annotations

import os
import shutil

from dockyard.sandboxes.host_folders import HostFolderSandbox


def bwrap_path() -> str | None:
    return shutil.which("bwrap")


class BubblewrapSandbox(HostFolderSandbox):
    kind = "bubblewrap"

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

    def wrap(self, argv: list[str], env: dict[str, str], cwd: str | None = None) -> list[str]:
        bwrap = ["bwrap", "--unshare-all", *(["--share-net"] if self.spec.network else []), "--die-with-parent", "--new-session", "--cap-drop", "ALL", "--clearenv",
                 "--ro-bind", "/usr", "/usr", "--ro-bind", "/etc", "/etc"]
        for link in ("bin", "lib", "lib64", "sbin"):
            if os.path.islink("/" + link):
                bwrap += ["--symlink", os.readlink("/" + link), "/" + link]
            elif os.path.isdir("/" + link):
                bwrap += ["--ro-bind", "/" + link, "/" + link]
        bwrap += ["--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp"]
        for inside, host in sorted(self.mounts.items()):
            bwrap += ["--ro-bind" if inside in self.read_only else "--bind", str(host), inside]
        bwrap += ["--remount-ro", "/", "--chdir", cwd or self.workdir]
        for key, value in env.items():
            bwrap += ["--setenv", key, value]
        return [*self.user_and_limits(), *bwrap, "--", *argv]
