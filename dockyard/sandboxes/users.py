"""The user ids sandboxes run as when dockyard is root: `env.sandbox.uid_range`, one lease per user of a
live sandbox (the agent's, and the verifier's once it takes over), checked against this machine's
user database before anything starts.

An id in the range must belong to nobody: a sandbox's processes are found and ended by their user id,
so an id shared with a real user, a group or a range of /etc/subuid (the ids rootless containers of
the machine's users run as) would make another's processes look like the sandbox's.
"""

from __future__ import annotations

import fcntl
import grp
import os
import pwd
import tempfile
from pathlib import Path

from dockyard.sandboxes.base import SandboxError
from dockyard.sandboxes.processes import end_processes, of_user

DEFAULT_UIDS = (200_000, 204_095)
LOCK_DIR = Path(tempfile.gettempdir()) / "dockyard-sandbox-uids"


def uid_range(config) -> tuple[int, int]:
    value = getattr(config, "uid_range", None)
    return (int(value[0]), int(value[1])) if value else DEFAULT_UIDS


def _sub_ranges(path: Path) -> list[tuple[str, int, int]]:
    """(owner, first, last) of each line of /etc/subuid or /etc/subgid."""
    ranges = []
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return ranges
    for line in lines:
        owner, _, rest = line.partition(":")
        start, _, count = rest.partition(":")
        if start.isdigit() and count.isdigit():
            ranges.append((owner, int(start), int(start) + int(count) - 1))
    return ranges


def uid_range_problem(config) -> str | None:
    """Why env.sandbox.uid_range cannot be used on this machine, or None."""
    first, last = uid_range(config)
    if first <= 0 or last < first:
        return f"env.sandbox.uid_range: [{first}, {last}] is not a range of user ids above 0 (first <= last)"
    needed = 2 * getattr(config, "max_concurrent", 1)
    if last - first + 1 < needed:
        return (f"env.sandbox.uid_range: [{first}, {last}] holds {last - first + 1} ids; {needed} are needed "
                f"(two per sandbox alive at once, env.sandbox.max_concurrent={needed // 2})")
    taken = ids_in_use(first, last)
    if taken:
        return (f"env.sandbox.uid_range: [{first}, {last}] overlaps ids this machine uses: "
                f"{', '.join(sorted(set(taken))[:5])}; choose a range nobody has")
    return unmapped_ids_problem(first, last) if os.geteuid() == 0 else None


def unmapped_ids_problem(first: int, last: int, uid_map: Path = Path("/proc/self/uid_map")) -> str | None:
    """Root gives each sandbox's files and processes to ids of the range; root of a user namespace that
    does not map them (ch-run, rootless podman: one id) cannot (chown says EINVAL)."""
    try:
        lines = uid_map.read_text().split()
    except OSError:
        return None
    ranges = [(int(lines[i]), int(lines[i]) + int(lines[i + 2]) - 1) for i in range(0, len(lines) - 2, 3)]
    if any(start <= first and last <= end for start, end in ranges):
        return None
    mapped = ", ".join(f"{start}-{end}" for start, end in ranges) or "none"
    return (f"env.sandbox.uid_range: [{first}, {last}] is not mapped in this process's user namespace (it maps ids "
            f"{mapped}: an unprivileged container such as ch-run or rootless podman); the sandboxes run their "
            "commands as those ids, so run this outside that container, or in one that maps them")


def ids_in_use(first: int, last: int) -> list[str]:
    """Users, groups and /etc/subuid / subgid ranges of this machine with an id in [first, last]."""
    taken = [f"user {u.pw_name} ({u.pw_uid})" for u in pwd.getpwall() if first <= u.pw_uid <= last]
    taken += [f"group {g.gr_name} ({g.gr_gid})" for g in grp.getgrall() if first <= g.gr_gid <= last]
    # directories that do not enumerate (LDAP) answer lookups
    for uid in range(first, last + 1, 256 if last - first < 1 << 16 else 65536):
        try:
            taken.append(f"user {pwd.getpwuid(uid).pw_name} ({uid})")
        except KeyError:
            pass
    for path in (Path("/etc/subuid"), Path("/etc/subgid")):
        taken += [f"{path} range of {owner} ({start}-{end})" for owner, start, end in _sub_ranges(path)
                  if start <= last and end >= first]
    return sorted(set(taken))


def lease_free(candidates, what: str, taken: str):
    """(value, lock handle) of the first candidate whose lock file is free and whose ids run no process
    (a dead trainer's leftovers are ended first; ids that cannot be cleaned are skipped). candidates:
    (value, lock file name, selector of its processes). SandboxError `taken` when none is free."""
    LOCK_DIR.mkdir(mode=0o700, exist_ok=True)
    for value, lock_name, processes in candidates:
        handle = open(LOCK_DIR / lock_name, "w")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            continue
        try:
            end_processes(processes, f"{what} {value} (left by a trainer that is gone)")
        except SandboxError:
            handle.close()
            continue
        return value, handle
    raise SandboxError(taken)


class UidLease:
    """An exclusive user id for one sandbox from [first, last], released when the lock file is closed (or
    the process dies). An id whose lock is free but that still has processes (a dead trainer's sandbox)
    is handed out only once they are gone: a new sandbox never shares its user with a leftover."""

    def __init__(self, first: int, last: int):
        self.uid, self._handle = lease_free(
            ((uid, str(uid), of_user(uid)) for uid in range(first, last + 1)), "sandbox user",
            f"all {last - first + 1} sandbox user ids of env.sandbox.uid_range [{first}, {last}] are taken (lock files "
            f"in {LOCK_DIR})")

    def release(self) -> None:
        self._handle.close()


# --- names for the sandboxes' users inside (whoami, getpass, ssh-keygen and `ls -l` need one) ---

def with_user_entries(passwd: str, group: str, users: list[tuple[str, int, str]]) -> tuple[str, str]:
    """/etc/passwd and /etc/group texts with an entry for each (name, uid, home) whose id they lack; a
    name taken by another id gets the id appended (`sandbox-200001`)."""
    def ids_and_names(text: str) -> tuple[set[int], set[str]]:
        ids, names = set(), set()
        for line in text.splitlines():
            fields = line.split(":")
            if len(fields) >= 3 and fields[2].isdigit():
                ids.add(int(fields[2]))
                names.add(fields[0])
        return ids, names

    passwd_ids, passwd_names = ids_and_names(passwd)
    group_ids, group_names = ids_and_names(group)
    passwd, group = passwd.rstrip("\n") + "\n" if passwd.strip() else "", group.rstrip("\n") + "\n" if group.strip() else ""
    for name, uid, home in users:
        chosen = name if name not in passwd_names | group_names else f"{name}-{uid}"
        if uid not in passwd_ids:
            passwd += f"{chosen}:x:{uid}:{uid}:dockyard sandbox:{home}:/bin/bash\n"
            passwd_ids.add(uid)
            passwd_names.add(chosen)
        if uid not in group_ids:
            group += f"{chosen}:x:{uid}:\n"
            group_ids.add(uid)
            group_names.add(chosen)
    return passwd, group
