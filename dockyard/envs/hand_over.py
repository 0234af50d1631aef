"""What the agent left in its folders when it handed over, so that the grader can tell the verifier's own
files from the agent's after the tests ran.

Published test scripts build their tools where they run: Terminal-Bench 1's standard `run-tests.sh`
runs `uv venv .tbench-testing` in the working folder and installs pytest into it. Everything under a
folder the agent could write counted as the agent's, so such a run was a verifier error. But the
agent's processes are gone for certain at the hand-over, and nothing of the agent's runs as the
verifier before pytest starts (tests that run the agent's code are their own trust, docs/agents.md), so
what the verifier's processes create after it is the verifier's. A file pytest loaded counts as the
verifier's when, walked from its host folder without following links:

- every component is a real folder or file (no link, old or new);
- the components split into ones that were there at the hand-over (by device and inode) followed by
  ones that were not, and the file's own folder is among the new ones (below a site-packages folder,
  the whole environment): a file made later in one of the agent's folders sits beside whatever the
  agent left there (a stale `.pyc`, a module it shadows, a `.pth` file Python runs at start; uv 0.9's
  `uv venv` keeps what stood in an environment folder the agent made), and an old entry below a new
  folder was moved there;
- the distribution it belongs to, if it lies in a site-packages folder, was installed from an index: an
  install from a path or URL (PEP 610's `direct_url.json`: `uv pip install /app/pkg`, a project's path
  source) puts the agent's code there under a new name.

Nothing counts as the verifier's when the walk at the hand-over was cut short (too deep, unreadable:
an entry it missed would look new). Inode numbers freed by the verifier and reused count as old: that
errs towards a verifier error, never towards a grade.

The same record names what of the agent's would steer uv, which those harnesses run: a `.python-version`
(uv takes the interpreter of the environment it makes from it, and it may name a program of the
agent's), a `pyproject.toml` that `uv run` would find from the working folder (it would sync the
agent's project and run the `pytest` of its environment) and a `.venv` where uv would keep the tests'
project environment (uv reuses it, with whatever `.pth` file or package the agent left in it).
terminal_trial.verify turns all three off for the tests.
"""

from __future__ import annotations

import csv
import hashlib
import io
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from dockyard.sandboxes import host_paths
from dockyard.sandboxes.base import Sandbox, SandboxError

MAX_DEPTH = 128          # deeper than this, the walk gives up and nothing made later is trusted
INTERPRETER_PINS = (".python-version", ".python-versions")
SITE_FOLDERS = ("site-packages", "dist-packages")
START_MODULES = ("sitecustomize.py", "usercustomize.py")
HOOK_READ_LIMIT = 64 * 1024
RECORD_LIMIT = 4 * 1024 * 1024


@dataclass(frozen=True)
class HandOver:
    """The agent's host folders (inside path -> host path) and the (device, inode) of every entry in
    them when it handed over; `distrust` says why nothing made later may count as the verifier's."""

    folders: dict[str, Path]
    inodes: frozenset[tuple[int, int]]
    distrust: str | None = None
    project: str | None = None   # a pyproject.toml of the agent's that `uv run` would find from the working folder
    interpreter_pin: str | None = None   # a .python-version of the agent's
    environment: str | None = None   # a project environment (.venv) where uv would put the tests' project's, not the image's
    start_hooks: tuple[str, ...] = ()   # files the agent left that Python runs at start (disable_start_hooks)

    def made_by_verifier(self, inside: str) -> bool:
        """Whether `inside` is a file the verifier's processes made after the hand-over (module doc)."""
        if self.distrust is not None:
            return False
        inside = os.path.normpath(inside)
        for mount, host in self.folders.items():
            if inside.startswith(mount.rstrip("/") + "/"):
                parts = os.path.relpath(inside, mount).split("/")
                return _new_below_old(host, parts, self.inodes) and not _installed_from_a_path(host, parts)
        return False


def take(sandbox: Sandbox, left_as_placed: Callable[[str], bool],
         wrote: Callable[[str], bool] = lambda path: False) -> HandOver:
    """The hand-over's record of the sandbox's host folders (call after Sandbox.hand_over, before the
    tests). `left_as_placed(inside)`: a file the task placed that the agent did not change (a task's own
    `.python-version` or project is the task's choice); `wrote(inside)`: with root inside, a file the
    agent made or changed outside its folders."""
    folders = sandbox.writable_host_folders()
    inodes: set[tuple[int, int]] = set()
    distrust = None if folders else "the sandbox keeps no folder of the agent's on this machine"
    pins, hooks = [], []
    for inside, host in folders.items():
        complete, found, started = _record(host, inodes)
        if not complete:
            distrust = f"{inside} could not be read whole at the hand-over (deeper than {MAX_DEPTH} or unreadable)"
        pins += [path for path in (os.path.join(inside, p) for p in found) if not left_as_placed(path)]
        hooks += [path for path in (os.path.join(inside, p) for p in started) if not left_as_placed(path)]
    pins += [path for name in INTERPRETER_PINS for path in [_found_above(sandbox, folders, name, left_as_placed, wrote)]
             if path and path not in pins]
    project = _found_above(sandbox, folders, "pyproject.toml", left_as_placed, wrote)
    return HandOver(folders, frozenset(inodes), distrust, project, (sorted(pins) or [None])[0],
                    _environment_left(sandbox, folders), tuple(sorted(hooks)))


def _environment_left(sandbox: Sandbox, folders: dict[str, Path]) -> str | None:
    """The `.venv` in the working folder or beside the project uv would find from it, when one is there
    and is not the image's own, as built: uv keeps a project environment it finds (`uv init; uv add
    pytest; uv run pytest`, a Terminal-Bench 1 harness, installed pytest into the agent's `.venv` and
    ran it with the `.pth` files the agent had left there)."""
    places = [os.path.normpath(sandbox.workdir or "/")]
    folder = places[0]
    while folder != "/" and not _exists_inside(folders, os.path.join(folder, "pyproject.toml")):
        folder = os.path.dirname(folder)
    if folder != "/":
        places.append(folder)
    for place in places:
        inside = os.path.join(place, ".venv")
        host = _host_path(folders, inside)
        if host is None or not os.path.lexists(host):
            continue
        image = Path(sandbox.spec.rootfs, inside.lstrip("/")) if getattr(sandbox.spec, "rootfs", None) else None
        if image is None or not _same_tree(host, image):
            return inside
    return None


def _host_path(folders: dict[str, Path], inside: str) -> Path | None:
    return next((Path(h, os.path.relpath(inside, m)) for m, h in folders.items()
                 if inside.startswith(m.rstrip("/") + "/")), None)


def _exists_inside(folders: dict[str, Path], inside: str) -> bool:
    host = _host_path(folders, inside)
    return host is not None and os.path.lexists(host)


def _same_tree(left: Path, right: Path, limit: int = 50_000) -> bool:
    """Whether two folders hold the same entries (types, link targets, file bytes), links never followed."""
    def entries(root: Path) -> dict[str, tuple] | None:
        found: dict[str, tuple] = {}
        for folder, names, files in os.walk(root, followlinks=False):
            for name in names + files:
                path = os.path.join(folder, name)
                info = os.lstat(path)
                if stat.S_ISLNK(info.st_mode):
                    found[os.path.relpath(path, root)] = ("link", os.readlink(path))
                elif stat.S_ISREG(info.st_mode):
                    found[os.path.relpath(path, root)] = ("file", info.st_size)
                else:
                    found[os.path.relpath(path, root)] = ("other", stat.S_IFMT(info.st_mode))
                if len(found) > limit:
                    return None
        return found
    try:
        if not (left.is_dir() and not left.is_symlink() and right.is_dir() and not right.is_symlink()):
            return False
        ours, theirs = entries(left), entries(right)
        if ours is None or ours != theirs:
            return False
        return all(_digest(left / path) == _digest(right / path) for path, kind in ours.items() if kind[0] == "file")
    except OSError:
        return False


def _digest(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as data:
        for block in iter(lambda: data.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _found_above(sandbox: Sandbox, folders: dict[str, Path], name: str, left_as_placed: Callable[[str], bool],
                 wrote: Callable[[str], bool]) -> str | None:
    """The file `name` that uv would discover from the working folder (itself or the nearest parent
    that has one), when the agent made or changed it; None when the nearest one is the task's own."""
    folder = os.path.normpath(sandbox.workdir or "/")
    while True:
        candidate = os.path.join(folder, name)
        host = _host_path(folders, candidate)
        if host is not None:
            if os.path.lexists(host):
                return None if left_as_placed(candidate) else candidate
        elif wrote(candidate):
            return candidate
        if folder == "/":
            return None
        folder = os.path.dirname(folder)


def _record(root: Path, inodes: set[tuple[int, int]]) -> tuple[bool, list[str], list[str]]:
    """Adds every entry under root (root included) to `inodes`; (whether the walk was whole, the
    interpreter pins and the start-up hooks found, relative to root)."""
    complete, pins, hooks = True, [], []
    try:
        info = os.lstat(root)
    except OSError:
        return False, pins, hooks
    inodes.add((info.st_dev, info.st_ino))
    stack = [("", 0)]
    while stack:
        relative, depth = stack.pop()
        try:
            entries = list(os.scandir(os.path.join(root, relative) if relative else root))
        except OSError:
            complete = False
            continue
        for entry in entries:
            try:
                info = entry.stat(follow_symlinks=False)
            except OSError:
                complete = False
                continue
            inodes.add((info.st_dev, info.st_ino))
            path = os.path.join(relative, entry.name) if relative else entry.name
            if entry.name in INTERPRETER_PINS:
                pins.append(path)
            if stat.S_ISREG(info.st_mode) and _starts_python_code(entry.path, entry.name, os.path.basename(relative)):
                hooks.append(path)
            if stat.S_ISDIR(info.st_mode):
                if depth + 1 >= MAX_DEPTH:
                    complete = False
                else:
                    stack.append((path, depth + 1))
    return complete, pins, hooks


def _starts_python_code(path: str, name: str, folder: str) -> bool:
    """A file Python runs at start in whatever interpreter has its folder on sys.path: a .pth file of a
    site folder with an `import` line (site.py executes those lines), a sitecustomize / usercustomize."""
    if name in START_MODULES:
        return True
    if not (name.endswith(".pth") and folder in SITE_FOLDERS):
        return False
    try:
        with open(path, "rb") as data:
            return any(line.startswith((b"import ", b"import\t")) for line in data.read(HOOK_READ_LIMIT).splitlines())
    except OSError:
        return True


def disable_start_hooks(left: HandOver) -> list[str]:
    """Makes the start-up hooks the agent left unreadable to everything in the sandbox (host root's, mode
    0: the sandbox's ids, root inside included, have no claim on an id their namespace does not map);
    Python passes over a .pth file it cannot read. The inside paths done."""
    done = []
    for inside in left.start_hooks:
        mount = next((m for m in left.folders if inside.startswith(m.rstrip("/") + "/")), None)
        if mount is None:
            continue
        *parents, name = os.path.relpath(inside, mount).split("/")
        try:   # every component walked without following a link (host_paths)
            folder = host_paths.open_folder(left.folders[mount], parents)
        except (OSError, SandboxError):
            continue
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=folder)
        except OSError:
            continue
        finally:
            os.close(folder)
        try:
            if stat.S_ISREG(os.fstat(fd).st_mode):
                os.fchown(fd, 0, 0)
                os.fchmod(fd, 0)
                done.append(inside)
        finally:
            os.close(fd)
    return done


def _new_below_old(root: Path, parts: list[str], old: frozenset[tuple[int, int]]) -> bool:
    """Walks root/parts one component at a time (never through a link): old components, then new ones
    from the file's folder at the latest."""
    if not parts or any(p in ("", ".", "..") for p in parts):
        return False
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        new_from = None
        for index, part in enumerate(parts):
            try:
                info = os.stat(part, dir_fd=fd, follow_symlinks=False)
            except OSError:
                return False
            if stat.S_ISLNK(info.st_mode):
                return False
            if (info.st_dev, info.st_ino) in old:
                if new_from is not None:
                    return False
            elif new_from is None:
                new_from = index
            if index < len(parts) - 1:
                if not stat.S_ISDIR(info.st_mode):
                    return False
                child = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
                os.close(fd)
                fd = child
        return new_from is not None and new_from <= _newest_allowed(parts) and stat.S_ISREG(info.st_mode)
    except OSError:
        return False
    finally:
        os.close(fd)


def _newest_allowed(parts: list[str]) -> int:
    """The component from which on everything must be new: the file's folder, or, below a site-packages
    folder, the environment that holds it (`<prefix>/lib/pythonX.Y/site-packages`): Python runs the
    `.pth` files of its site folders at start, and uv keeps whatever stood in an existing environment's
    folder (0.9: `uv venv` over one the agent made leaves its files)."""
    site = max((i for i, part in enumerate(parts) if part in SITE_FOLDERS), default=None)
    if site is None:
        return len(parts) - 2
    if site >= 3 and parts[site - 2] in ("lib", "lib64") and parts[site - 1].startswith("python"):
        return site - 3
    return site


def _installed_from_a_path(root: Path, parts: list[str]) -> bool:
    """Whether the file belongs to a distribution in a site-packages folder whose installer recorded a
    direct URL (a local path, a VCS or archive URL: not an index), or to none that lists it."""
    site = max((i for i, part in enumerate(parts) if part in SITE_FOLDERS), default=None)
    if site is None:
        return False
    folder = Path(root, *parts[:site + 1])
    relative = "/".join(parts[site + 1:])
    try:
        infos = [entry for entry in os.scandir(folder) if entry.name.endswith(".dist-info")
                 and entry.is_dir(follow_symlinks=False)]
    except OSError:
        return True
    for info in infos:
        try:
            with open(os.path.join(info.path, "RECORD"), "rb") as handle:
                text = handle.read(RECORD_LIMIT).decode("utf-8", errors="replace")
        except OSError:
            continue
        listed = {os.path.normpath(row[0]) for row in csv.reader(io.StringIO(text)) if row}
        if relative in listed:
            return os.path.lexists(os.path.join(info.path, "direct_url.json"))
    return True
