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
agent's) and a `pyproject.toml` that `uv run` would find from the working folder (it would sync the
agent's project and run the `pytest` of its environment). terminal_trial.verify turns both off for the
tests.
"""

from __future__ import annotations

import csv
import io
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from dockyard.sandboxes.base import Sandbox

MAX_DEPTH = 128          # deeper than this, the walk gives up and nothing made later is trusted
INTERPRETER_PINS = (".python-version", ".python-versions")
SITE_FOLDERS = ("site-packages", "dist-packages")
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
    pins = []
    for inside, host in folders.items():
        complete, found = _record(host, inodes)
        if not complete:
            distrust = f"{inside} could not be read whole at the hand-over (deeper than {MAX_DEPTH} or unreadable)"
        pins += [path for path in (os.path.join(inside, p) for p in found) if not left_as_placed(path)]
    pins += [path for name in INTERPRETER_PINS for path in [_found_above(sandbox, folders, name, left_as_placed, wrote)]
             if path and path not in pins]
    return HandOver(folders, frozenset(inodes), distrust,
                    _found_above(sandbox, folders, "pyproject.toml", left_as_placed, wrote), (sorted(pins) or [None])[0])


def _found_above(sandbox: Sandbox, folders: dict[str, Path], name: str, left_as_placed: Callable[[str], bool],
                 wrote: Callable[[str], bool]) -> str | None:
    """The file `name` that uv would discover from the working folder (itself or the nearest parent
    that has one), when the agent made or changed it; None when the nearest one is the task's own."""
    folder = os.path.normpath(sandbox.workdir or "/")
    while True:
        candidate = os.path.join(folder, name)
        host = next((Path(h, os.path.relpath(candidate, m)) for m, h in folders.items()
                     if candidate.startswith(m.rstrip("/") + "/")), None)
        if host is not None:
            if os.path.lexists(host):
                return None if left_as_placed(candidate) else candidate
        elif wrote(candidate):
            return candidate
        if folder == "/":
            return None
        folder = os.path.dirname(folder)


def _record(root: Path, inodes: set[tuple[int, int]]) -> tuple[bool, list[str]]:
    """Adds every entry under root (root included) to `inodes`; (whether the walk was whole, the
    interpreter pins found, relative to root)."""
    complete, pins = True, []
    try:
        info = os.lstat(root)
    except OSError:
        return False, pins
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
            if stat.S_ISDIR(info.st_mode):
                if depth + 1 >= MAX_DEPTH:
                    complete = False
                else:
                    stack.append((path, depth + 1))
    return complete, pins


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
