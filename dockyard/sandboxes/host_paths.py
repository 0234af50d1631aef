"""Copies between the trainer and a sandbox's host folders that never follow a link the agent planted.

The trainer copies into and out of a workspace as root, and the agent owns that workspace: a path
like `out/report.txt` where the agent made `out` a link to `/etc` would read or write the host's
`/etc`. So every path is walked one component at a time with O_NOFOLLOW from the folder's own file
descriptor (openat), every file is created with O_EXCL after whatever stood at its name was removed,
and a link met inside a copied-out folder is left out (a consumer on the host could follow it).
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
import subprocess
from pathlib import Path

from dockyard.sandboxes.base import SandboxError

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def parts_of(relative: str) -> list[str]:
    parts = [p for p in relative.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise SandboxError(f"{relative!r}: a path with '..' is refused")
    return parts


def open_folder(root: Path, parts: list[str], create: bool = False, owner: tuple[int, int] | None = None,
                mode: int = 0o755) -> int:
    """A descriptor of root/parts..., each component a real folder (not a link); missing ones made
    when `create` (owned by `owner`)."""
    fd = os.open(root, DIR_FLAGS)
    try:
        for part in parts:
            try:
                child = os.open(part, DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                os.mkdir(part, mode, dir_fd=fd)
                if owner is not None:
                    os.chown(part, *owner, dir_fd=fd, follow_symlinks=False)
                child = os.open(part, DIR_FLAGS, dir_fd=fd)
            except OSError as err:
                if err.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise SandboxError(f"{'/'.join(parts)}: {part} is a link or not a folder; nothing is "
                                       "copied through it") from None
                raise
            os.close(fd)
            fd = child
        return fd
    except BaseException:
        os.close(fd)
        raise


def _clear(name: str, dir_fd: int, keep_folder: bool) -> None:
    """Remove what stands at `name` (a link, a file; a folder unless it is to be kept)."""
    try:
        info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(info.st_mode):
        if not keep_folder:
            folder = os.open(name, DIR_FLAGS, dir_fd=dir_fd)
            try:
                _empty(folder)
            finally:
                os.close(folder)
            os.rmdir(name, dir_fd=dir_fd)
    else:
        os.unlink(name, dir_fd=dir_fd)


def remove(root: Path, relative: str) -> None:
    """Remove whatever stands at root/relative (a folder with all it holds), following no link on the way;
    nothing when a folder on the way is missing."""
    parts = parts_of(relative)
    if not parts:
        raise SandboxError(f"{root}: the folder itself is not removed")
    try:
        folder = open_folder(root, parts[:-1])
    except FileNotFoundError:
        return
    try:
        _clear(parts[-1], folder, keep_folder=False)
    finally:
        os.close(folder)


def _empty(folder: int) -> None:
    for entry in os.listdir(folder):
        _clear(entry, folder, keep_folder=False)


def copy_into(source: Path, folder: int, name: str, owner: tuple[int, int] | None, clear_bits: int = 0) -> None:
    """Copy host path `source` to `name` in the folder `folder` (a descriptor): links in the source stay
    links, whatever stood at the target is replaced, nothing is followed. `clear_bits` are cleared
    from every mode (0o022: read-only to the sandbox's user)."""
    info = os.lstat(source)
    mode = stat.S_IMODE(info.st_mode) & ~clear_bits
    if stat.S_ISLNK(info.st_mode):
        _clear(name, folder, keep_folder=False)
        os.symlink(os.readlink(source), name, dir_fd=folder)
    elif stat.S_ISDIR(info.st_mode):
        _clear(name, folder, keep_folder=True)
        try:
            os.mkdir(name, 0o700, dir_fd=folder)
        except FileExistsError:
            pass
        child = os.open(name, DIR_FLAGS, dir_fd=folder)
        try:
            for entry in sorted(os.listdir(source)):
                copy_into(source / entry, child, entry, owner, clear_bits)
            os.fchmod(child, mode | (0o555 if clear_bits else 0))
            if owner is not None:
                os.fchown(child, *owner)
        finally:
            os.close(child)
    else:
        _clear(name, folder, keep_folder=False)
        target = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                         dir_fd=folder)
        try:
            with open(source, "rb") as data, os.fdopen(os.dup(target), "wb") as out:
                shutil.copyfileobj(data, out, 1024 * 1024)
            os.fchmod(target, mode | (0o444 if clear_bits else 0))
            if owner is not None:
                os.fchown(target, *owner)
            os.utime(target, ns=(info.st_atime_ns, info.st_mtime_ns))
        finally:
            os.close(target)
    if stat.S_ISLNK(info.st_mode) and owner is not None:
        os.chown(name, *owner, dir_fd=folder, follow_symlinks=False)


def copy_in(source: Path, root: Path, relative: str, owner: tuple[int, int] | None, clear_bits: int = 0) -> None:
    """source -> root/relative, its parent folders made as needed (owned by `owner`)."""
    parts = parts_of(relative)
    if not parts:   # into the folder itself: a folder's entries, or a file by its name
        folder = open_folder(root, [])
        try:
            for entry in sorted(os.listdir(source)) if source.is_dir() else [None]:
                copy_into(source / entry if entry else source, folder, entry or source.name, owner, clear_bits)
        finally:
            os.close(folder)
        return
    folder = open_folder(root, parts[:-1], create=True, owner=owner)
    try:
        copy_into(source, folder, parts[-1], owner, clear_bits)
    finally:
        os.close(folder)


MAX_DEPTH = 200   # folders nested deeper than this (an agent's trick against recursive copies) are refused


def _copy_from(folder: int, name: str, target: Path, links: bool, depth: int = 0) -> None:
    if depth > MAX_DEPTH:
        raise SandboxError(f"folders nested more than {MAX_DEPTH} deep are not copied out")
    info = os.stat(name, dir_fd=folder, follow_symlinks=False)
    if stat.S_ISLNK(info.st_mode) and links:
        os.symlink(os.readlink(name, dir_fd=folder), target)   # made, never followed here
        return
    if stat.S_ISLNK(info.st_mode) or not (stat.S_ISDIR(info.st_mode) or stat.S_ISREG(info.st_mode)):
        return   # links (unless kept), fifos and devices are not copied out
    if stat.S_ISDIR(info.st_mode):
        child = os.open(name, DIR_FLAGS, dir_fd=folder)
        try:
            target.mkdir(parents=True, exist_ok=True)
            target.chmod(stat.S_IMODE(info.st_mode) | 0o700)
            for entry in os.listdir(child):
                _copy_from(child, entry, target / entry, links, depth + 1)
        finally:
            os.close(child)
        return
    source = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=folder)
    with os.fdopen(source, "rb") as data, open(target, "wb") as out:
        shutil.copyfileobj(data, out, 1024 * 1024)
    target.chmod(stat.S_IMODE(info.st_mode))


def copy_out(root: Path, relative: str, target: Path, shown: str, links: bool = False) -> None:
    """root/relative -> host path `target`; SandboxError when it is missing or a link (`shown`: its
    path inside, for the message). Links inside a copied folder are left out, or with `links` made
    as links (for a copy that goes into another sandbox, never read through on the host)."""
    parts = parts_of(relative)
    try:
        folder = open_folder(root, parts[:-1])
    except (FileNotFoundError, SandboxError):
        raise SandboxError(f"{shown} does not exist in the sandbox (or a folder on its way is a link)") from None
    if not parts:   # the whole folder
        try:
            target.mkdir(parents=True, exist_ok=True)
            for entry in os.listdir(folder):
                _copy_from(folder, entry, target / entry, links)
        finally:
            os.close(folder)
        return
    try:
        try:
            info = os.stat(parts[-1], dir_fd=folder, follow_symlinks=False)
        except FileNotFoundError:
            info = None
        if info is None or stat.S_ISLNK(info.st_mode):
            raise SandboxError(f"{shown} does not exist in the sandbox (or is a link)")
        target.parent.mkdir(parents=True, exist_ok=True)
        _copy_from(folder, parts[-1], target, links)
    finally:
        os.close(folder)


def chown_tree(root: Path, owner: tuple[int, int]) -> None:
    """Everything under `root` (itself included) owned by `owner`; links are changed, not followed.
    chown(1) walks any depth (a Python walk of an agent's 10000-deep folders would not)."""
    result = subprocess.run(["chown", "-R", "-h", "-P", f"{owner[0]}:{owner[1]}", str(root)], capture_output=True,
                            text=True, timeout=600)
    if result.returncode != 0:
        raise SandboxError(f"could not hand {root} over to user {owner[0]}: {result.stderr.strip()[-300:]}")


def walk(root: Path, max_depth: int = 32):
    """(folder, entry name, lstat) of everything under `root` down to max_depth, without recursion and
    without following links; entries that cannot be read are passed over."""
    stack = [(str(root), 0)]
    while stack:
        folder, depth = stack.pop()
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            try:
                info = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            yield folder, entry.name, info
            if stat.S_ISDIR(info.st_mode) and depth < max_depth:
                stack.append((entry.path, depth + 1))
