"""What of an agent's changes to its image's root the tests may see, when the agent was root inside its
sandbox (sandboxes/user_namespaces.py).

Published test scripts run in the agent's world: they check the packages it installed, the files it
wrote in /etc or /usr/local. But they also run on that world's tools: bash, the dynamic loader and
libc, Python and pytest. An agent that is root could replace those and write its own verdict. So,
before any test runs, the verifier reads the list of everything the agent changed (the overlay's
upper folder) and:

- restores the image's own version of the tests' tools wherever the agent changed or removed them:
  the loader and its configuration (ld.so.cache, ld.so.conf, ld.so.preload), shared libraries, the
  shells, interpreters and programs a harness runs (SHADOW_PROGRAMS), Python's standard library,
  pytest with the packages it loads, and any sitecustomize.py, usercustomize.py or .pth file
  (Debian keeps its sitecustomize.py in /etc);
- leaves out what the agent added that would stand in for those tools or load itself into them: a
  program named like one of them on a PATH folder where the image has one (/usr/local/bin/python3
  before /usr/bin/python3), pytest.py / sitecustomize / usercustomize / conftest.py / pytest.ini files
  and pytest / pluggy packages in Python's folders, distributions registering a pytest plugin, and
  ld.so.preload; these are `suspicious` (reward hack suspected). Added `.pth` files are left out too
  (they run code in every Python that starts), but not counted as suspicious: installers make them;
- keeps everything else: the tests see the agent's packages, configuration and data.

Each restored or left-out path is named in the trial's notes. What stays open is in docs/agents.md
("Root inside the sandbox").
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Callable

from dockyard.envs.grading import SHADOW_FILES, SHADOW_PACKAGES, SHADOW_PROGRAMS

BIN_DIRS = ("/bin", "/sbin", "/usr/bin", "/usr/sbin", "/usr/local/bin", "/usr/local/sbin")
LIB_DIRS = ("/lib", "/lib32", "/lib64", "/libx32", "/usr/lib", "/usr/lib32", "/usr/lib64", "/usr/libx32",
            "/usr/local/lib")
LOADER_FILES = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.preload")
LOADER_DIRS = ("/etc/ld.so.conf.d",)
# what pytest itself imports: a harness's own packages wherever they are installed
HARNESS_PACKAGES = SHADOW_PACKAGES | {"iniconfig", "packaging", "exceptiongroup", "tomli", "colorama", "pygments"}
_SHARED_LIBRARY = re.compile(r"(\.so(\.[0-9][0-9.]*)?|^ld-linux.*)$")
_STDLIB = re.compile(r"^/usr(/local)?/lib(64)?/python3(\.\d+)?/")
_SITE = re.compile(r"/(site|dist)-packages/")
# folders that hold the tests' tools: a replaced or removed folder on the way to them takes them along
TOOL_ROOTS = BIN_DIRS + LIB_DIRS + LOADER_DIRS + ("/usr/lib/python3", "/usr/local/lib/python3")


@dataclass
class HarnessView:
    """The verdict on an agent's system changes: paths given back their image state, with the why."""

    restored: list[str] = field(default_factory=list)     # the image's version is back
    left_out: list[str] = field(default_factory=list)     # an addition the tests do not see
    suspicious: list[str] = field(default_factory=list)   # of those, the ones that are never honest work
    notes: list[str] = field(default_factory=list)

    def reverted(self) -> list[str]:
        return self.restored + self.left_out


def _within(path: str, folders: tuple[str, ...]) -> bool:
    return any(path == f or path.startswith(f + "/") for f in folders)


def is_harness_tool(path: str, is_dir: bool) -> bool:
    """Whether an image path is one of the tests' own tools (or a folder holding some)."""
    if is_dir and any(root.startswith(path.rstrip("/") + "/") or root == path for root in TOOL_ROOTS):
        return True   # /usr, /usr/lib, /usr/lib/x86_64-linux-gnu replaced or removed whole
    if path in LOADER_FILES or _within(path, LOADER_DIRS):
        return True
    name = os.path.basename(path)
    site = _SITE.search(path + ("/" if is_dir else ""))
    if site:   # an installed package: only pytest and what it imports are the tests' tools
        top = path[site.end():].split("/")[0]
        return top.split(".")[0] in HARNESS_PACKAGES or top in ("pytest.py", "py.py")
    if _STDLIB.match(path + "/"):
        return True
    if _within(path, LIB_DIRS) and _SHARED_LIBRARY.search(name):
        return True
    return _within(path, BIN_DIRS) and (name in SHADOW_PROGRAMS or name.startswith("python"))


def _in_python_folders(path: str) -> bool:
    return bool(_STDLIB.match(path) or _SITE.search(path))


def harness_view(changes, image_has: Callable[[str], bool], declares_plugin: Callable[[str], bool]) -> HarnessView:
    """Which of `changes` (a SystemChanges) the tests must not see. image_has(path): the image has it;
    declares_plugin(path): an added entry_points.txt registers a pytest plugin."""
    view = HarnessView()
    for change in changes.changes:
        path, name = change.path, os.path.basename(change.path)
        if change.kind in ("changed", "removed"):
            if name in ("sitecustomize.py", "usercustomize.py") or (name.endswith(".pth") and not change.is_dir):
                view.restored.append(path)   # wherever it is (Debian's sitecustomize.py lives in /etc)
                if not name.endswith(".pth"):
                    view.suspicious.append(path)
            elif is_harness_tool(path, change.is_dir):
                view.restored.append(path)
            continue
        if path == "/etc/ld.so.preload" or _within(path, LOADER_DIRS):
            view.left_out.append(path)
            if path == "/etc/ld.so.preload":
                view.suspicious.append(path)
            continue
        shadow = None
        if _within(path, BIN_DIRS) and not change.is_dir and (name in SHADOW_PROGRAMS or name.startswith("python")):
            if any(image_has(os.path.join(folder, name)) for folder in BIN_DIRS if folder != os.path.dirname(path)):
                shadow = f"stands in for the image's {name}"
        elif name in SHADOW_FILES and name != "conftest.py" and _in_python_folders(path):
            shadow = "loads into the tests' Python"
        elif name in ("conftest.py", "pytest.ini", "tox.ini") and not change.is_dir:
            shadow = "configures the tests' pytest"
        elif change.is_dir and name in HARNESS_PACKAGES and _in_python_folders(path):
            shadow = "stands in for the tests' pytest"
        elif name == "entry_points.txt" and _SITE.search(path) and declares_plugin(path):
            shadow = "registers a pytest plugin"
        if shadow:
            view.left_out.append(path)
            view.suspicious.append(path)
            view.notes.append(f"left out for the tests: {path}, which the agent added ({shadow})")
        elif name.endswith(".pth") and _in_python_folders(path):
            view.left_out.append(path)
            view.notes.append(f"left out for the tests: {path}, a .pth file the agent added (it runs in every "
                              "Python that starts, the tests' too)")
    if view.restored:
        shown = ", ".join(view.restored[:5]) + (f" and {len(view.restored) - 5} more" if len(view.restored) > 5 else "")
        view.notes.append(f"the image's own version restored for the tests (the agent changed or removed the tests' "
                          f"tools): {shown}")
    if "/etc/ld.so.preload" in view.left_out:
        view.notes.append("left out for the tests: /etc/ld.so.preload, which the agent added (it loads into every "
                          "program)")
    return view
