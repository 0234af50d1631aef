"""A cgroup per sandbox where this machine lets dockyard make one (root, a writable memory controller):
the memory of the whole sandbox (every process, and the tmpfs pages they write) is capped, not only
each process's address space.

cgroup v1 (a `memory` hierarchy, as on this project's machines) and v2 (the unified hierarchy with
the memory controller) are both handled; where neither can be written (a normal user, a container
without cgroup access) `create` returns None and the per-process caps are all there is (the docs
say so). A command joins the cgroup through a prefix that writes its own pid into `cgroup.procs`
before it execs the rest, so everything it starts is inside from its first instruction.
"""

from __future__ import annotations

import os
from pathlib import Path

V1 = Path("/sys/fs/cgroup/memory")
V2 = Path("/sys/fs/cgroup")
PARENT = "dockyard"


def _writable(folder: Path) -> bool:
    return folder.is_dir() and os.access(folder, os.W_OK)


def _v2_with_memory() -> bool:
    controllers = V2 / "cgroup.controllers"
    return controllers.is_file() and "memory" in controllers.read_text().split()


def memory_controller() -> bool:
    """Whether this machine's cgroups have a memory controller (podman's --memory takes effect)."""
    return (V1.is_dir() and not (V1 / "cgroup.controllers").exists()) or _v2_with_memory()


class SandboxCgroup:
    def __init__(self, path: Path):
        self.path = path

    @classmethod
    def create(cls, name: str, memory_bytes: int) -> "SandboxCgroup | None":
        if os.geteuid() != 0:
            return None
        try:
            if _writable(V1) and not (V1 / "cgroup.controllers").exists():
                folder = V1 / PARENT / name
                folder.mkdir(parents=True, exist_ok=True)
                (folder / "memory.limit_in_bytes").write_text(str(memory_bytes))
                return cls(folder)
            if _writable(V2) and _v2_with_memory():
                parent = V2 / PARENT
                parent.mkdir(exist_ok=True)
                (V2 / "cgroup.subtree_control").write_text("+memory")
                (parent / "cgroup.subtree_control").write_text("+memory")
                folder = parent / name
                folder.mkdir(exist_ok=True)
                (folder / "memory.max").write_text(str(memory_bytes))
                return cls(folder)
        except OSError:
            return None
        return None

    def join_prefix(self) -> list[str]:
        """argv prefix: the command's own process enters the cgroup, then becomes the command."""
        return ["sh", "-c", 'echo $$ > "$0" && exec "$@"', str(self.path / "cgroup.procs")]

    def pids(self) -> list[int]:
        try:
            return [int(p) for p in (self.path / "cgroup.procs").read_text().split()]
        except OSError:
            return []

    def remove(self) -> None:
        """Once its processes are gone (the sandbox ended them): an empty cgroup is removed with rmdir."""
        try:
            self.path.rmdir()
        except OSError:
            pass


def leftover_cgroups() -> list[Path]:
    """Sandbox cgroups on this machine (reaping: their names carry the owner's token)."""
    found = []
    for root in (V1, V2):
        parent = root / PARENT
        if parent.is_dir():
            found += [p for p in parent.iterdir() if p.is_dir()]
    return found

