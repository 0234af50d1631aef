"""What a trainer that died (SIGKILL, a node's OOM killer) left of its sandboxes on this machine, reaped
by the next trainer that starts one: podman containers, network namespaces with their slirp4netns,
host folders (tmpfs included) and cgroups whose owner token names a process that is gone. Their
processes are the sandbox users' leftovers: a user id is handed out again only once they are gone
(host_folders.UidLease), and a leftover container takes its processes with it.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from dockyard.sandboxes.cgroups import leftover_cgroups
from dockyard.sandboxes.network import PREFIX as NETNS_PREFIX
from dockyard.sandboxes.network import leftover_namespaces, remove_namespace
from dockyard.sandboxes.owners import owner_alive

_TOKEN = re.compile(r"(\d+-\d+)")
# scratch folders of the SWE environment (swe_tasks.RepoStore's checkouts, swe_environments' build contexts)
SWE_REPOS_PREFIX, SWE_BUILD_PREFIX = "dockyard-swe-repos-", "dockyard-swe-env-"
_done = False
_lock = threading.Lock()


def _token(name: str, prefix: str) -> str | None:
    match = _TOKEN.match(name[len(prefix):]) if name.startswith(prefix) else None
    return match.group(1) if match else None


def leftover_containers() -> list[tuple[str, str]]:
    """(name, owner token) of every dockyard container on this machine."""
    if shutil.which("podman") is None:
        return []
    from dockyard.sandboxes.podman import OWNER_LABEL, PODMAN

    out = subprocess.run([*PODMAN, "ps", "-a", "--filter", f"label={OWNER_LABEL}", "--format", "json"],
                         capture_output=True, text=True, timeout=60)
    rows = json.loads(out.stdout or "[]") if out.returncode == 0 else []
    return [(row["Names"][0], row.get("Labels", {}).get(OWNER_LABEL, "")) for row in rows]


def reap_leftovers() -> list[str]:
    """Remove what dead trainers left; what was removed, one line each."""
    from dockyard.sandboxes.host_folders import FOLDER_PREFIX, unmount
    from dockyard.sandboxes.podman import PODMAN

    removed = []
    for name, owner in leftover_containers():
        if not owner_alive(owner):
            subprocess.run([*PODMAN, "rm", "-f", "-t", "0", name], capture_output=True, timeout=120)
            removed.append(f"podman container {name}")
    for name in leftover_namespaces():
        token = _token(name, NETNS_PREFIX)
        if token and not owner_alive(token):
            remove_namespace(name)
            removed.append(f"network namespace {name}")
    temp = Path(tempfile.gettempdir())
    for prefix in (FOLDER_PREFIX, "dockyard-podman-", SWE_REPOS_PREFIX, SWE_BUILD_PREFIX):
        for folder in temp.glob(prefix + "*"):
            token = _token(folder.name, prefix)
            if token and not owner_alive(token):
                unmount(folder)
                shutil.rmtree(folder, ignore_errors=True)
                removed.append(f"{'sandbox' if prefix in (FOLDER_PREFIX, 'dockyard-podman-') else 'SWE scratch'} folder {folder}")
    for group in leftover_cgroups():
        token = _token(group.name, FOLDER_PREFIX)
        if token and not owner_alive(token):
            from dockyard.sandboxes.processes import end_processes

            end_processes(lambda pid, g=group: pid in (g / "cgroup.procs").read_text().split(), f"cgroup {group}")
            try:
                group.rmdir()
                removed.append(f"cgroup {group}")
            except OSError:
                pass
    return removed


def reap_once() -> None:
    """reap_leftovers the first time this process makes a sandbox, saying what it removed."""
    global _done
    with _lock:
        if _done:
            return
        _done = True
        removed = reap_leftovers()
    if removed:
        print(f"dockyard: removed what a stopped trainer left of its sandboxes: {'; '.join(removed)}",
              file=sys.stderr, flush=True)
