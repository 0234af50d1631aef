"""Grading where the agent cannot reach: the world the tests run in, the record pytest writes, reward
files, and what in a workspace shadows test machinery. The terminal trials and the SWE scorer use it.

The policy is an adversary of its grader. Before any test runs the sandbox is handed over
(Sandbox.hand_over: the agent's processes are gone for certain, the workspace is the verifier's
user's). Then the tests run with:

- a clean environment: the task's ENV lines without a PATH, PYTHONPATH or library-path entry the
  agent could write (the workspace, /tmp, /var/tmp, /dev/shm), nor a start-up hook (BASH_ENV,
  LD_PRELOAD, PYTHONSTARTUP, ...) pointing there; HOME in a fresh folder of the verifier's; no
  Python user site (PYTHONNOUSERSITE), and for terminal tasks Python's safe-path mode (PYTHONSAFEPATH:
  `python3 -m pytest` from the workspace does not import a pytest.py lying there);
- git hooks and fsmonitor commands off; uv and pip read no configuration file (UV_NO_CONFIG,
  PIP_CONFIG_FILE=/dev/null: a uv.toml in the working folder could point them at the agent's own
  wheels); `uv venv` clears what stood in its folder (UV_VENV_CLEAR: Terminal-Bench's harness makes
  `.tbench-testing` in the working folder, where the agent could leave one with its own `pytest`
  and `.pth` files); pytest's plugin autoload stays on for terminal tasks (the
  published test scripts load their reporters that way, `uvx --with pytest-json-ctrf pytest --ctrf`):
  a plugin the agent could have installed is caught by the record below, wherever it loads from;
- dockyard's record plugin loaded into the real pytest (pytest_record.py): it writes each test's
  outcome, the session's exit status and every plugin and conftest.py file that was loaded to
  /verifier-records, which only the verifier writes. The pytest grade comes from that record,
  checked against the exit status; a summary printed on stdout never pays, and a conftest.py or
  plugin from a place the agent could write makes the grade a verifier error;
- a fresh /logs/verifier of the verifier's for Harbor's reward files, read only after every process
  the tests started is gone; a reward that is not one finite number within the task's range is a
  verifier error with reward 0, named in the log and counted.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import secrets
import shlex
import stat
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from dockyard.sandboxes import host_paths
from dockyard.sandboxes.base import BASE_ENV, Sandbox, SandboxError

PLUGIN = Path(__file__).with_name("pytest_record.py")
PLUGIN_PREFIX = "dockyard_record_"   # + a random name per verification: an ini's `-p no:<name>` cannot aim at it
VERIFIER = "/verifier"
LIB, HOME, RECORDS = f"{VERIFIER}/lib", "/verifier-home", "/verifier-records"   # one top-level folder each: read-only, or the verifier's
REWARD_FOLDER = "/logs/verifier"
READ_LIMIT = 1024 * 1024      # a record or reward file larger than this is not read
FOREIGN = "pytest used a plugin, conftest.py or configuration file the agent could have written"

# variables holding lists of folders searched for programs, modules or libraries
SEARCH_PATHS = ("PATH", "PYTHONPATH", "LD_LIBRARY_PATH", "PERL5LIB", "PERLLIB", "NODE_PATH", "RUBYLIB", "GEM_PATH",
                "CLASSPATH")
# variables that make a program run or load something at start
START_HOOKS = ("LD_PRELOAD", "LD_AUDIT", "BASH_ENV", "ENV", "PYTHONSTARTUP", "PYTHONHOME", "PYTHONUSERBASE",
               "NODE_OPTIONS", "PROMPT_COMMAND", "PYTEST_ADDOPTS", "PYTEST_PLUGINS", "GIT_CONFIG_GLOBAL",
               "GIT_EXEC_PATH", "GIT_TEMPLATE_DIR")

# names that would stand in for test machinery if found on a search path or beside a test
SHADOW_FILES = {"pytest.py", "py.py", "_pytest.py", "pluggy.py", "conftest.py", "sitecustomize.py",
                "usercustomize.py", "pytest.ini", "tox.ini", "dockyard_pytest_record.py"}
SHADOW_PACKAGES = {"pytest", "_pytest", "pluggy", "py"}
SHADOW_PROGRAMS = {"python", "python3", "pytest", "py.test", "bash", "sh", "dash", "env", "uv", "uvx", "pip", "pip3",
                   "node", "perl", "timeout", "tee", "cat", "test", "git"}


@dataclass
class Grade:
    reward: float
    output: str                      # the test command's output and the grader's verdict, for the logs
    error: str | None = None         # a verifier error: the reward is 0 and this says why
    suspicious: list[str] = field(default_factory=list)   # what in the workspace shadows test machinery
    notes: list[str] = field(default_factory=list)
    tests_ran: str = "no"            # "pytest" (its record), "reward file" (Harbor, no pytest record) or "no"


# what a test harness prints when it dies before its tests run (the line quoted in the verdict)
HARNESS_FAILURES = re.compile(
    r"command not found|Could not resolve host|Temporary failure in name resolution|Network is unreachable|"
    r"Failed to connect|Connection refused|No module named|No such file or directory|Permission denied|"
    r"Read-only file system|cannot execute|not found|error:|Error:", re.IGNORECASE)
NETWORK_FAILURES = re.compile(r"Could not resolve host|Temporary failure in name resolution|Network is unreachable|"
                              r"Failed to connect|Connection refused|Max retries exceeded|getaddrinfo", re.IGNORECASE)


def harness_failure(output: str) -> str | None:
    """The line of a test harness's output that says why it stopped, if one does: the first that names
    the network (a harness that fetches its tools), else the first error."""
    lines = output.splitlines()
    for pattern in (NETWORK_FAILURES, HARNESS_FAILURES):
        for line in lines:
            if pattern.search(line):
                return line.strip()[:200]
    return None


def _within(path: str, folders: list[str]) -> bool:
    path = os.path.normpath(path)
    return any(path == f or path.startswith(f.rstrip("/") + "/") for f in folders)


def new_plugin_name() -> str:
    """The record plugin's module name for one verification."""
    return PLUGIN_PREFIX + secrets.token_hex(8)


def verifier_env(sandbox: Sandbox, task_env: dict[str, str], test_dirs: list[str], safe_path: bool,
                 plugin_autoload: bool, plugin: str | None) -> tuple[dict[str, str], list[str]]:
    """The tests' environment (with the record plugin `plugin` loaded into pytest), and a note for
    each setting of the task's that was dropped."""
    writable = sandbox.agent_writable()
    notes = []
    env = dict(BASE_ENV)
    for key, value in task_env.items():
        if key in SEARCH_PATHS:
            kept = [entry for entry in value.split(":") if entry and entry.startswith("/") and not _within(entry, writable)]
            dropped = [entry for entry in value.split(":") if entry and entry not in kept]
            if dropped:
                notes.append(f"{key} entries the agent could write were left out for the tests: {', '.join(dropped)}")
            if kept:
                env[key] = ":".join(kept)
            else:
                env.pop(key, None)
        elif key in START_HOOKS or key.startswith(("LD_", "GIT_", "PYTEST_")):
            notes.append(f"{key} from the task was left out for the tests (a start-up hook)")
        else:
            env[key] = value
    python_path = [LIB, *test_dirs, *([p for p in env.get("PYTHONPATH", "").split(":") if p])]
    env.update({"HOME": HOME, "PYTHONPATH": ":".join(python_path), "PYTHONNOUSERSITE": "1",
                "PYTHONDONTWRITEBYTECODE": "1", "DOCKYARD_RECORDS": RECORDS, "PYTEST_ADDOPTS": "-p no:cacheprovider",
                "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_COUNT": "4",
                "GIT_CONFIG_KEY_0": "core.hooksPath", "GIT_CONFIG_VALUE_0": "/dev/null",
                "GIT_CONFIG_KEY_1": "core.fsmonitor", "GIT_CONFIG_VALUE_1": "false",
                # a repository's own config asked `git log` to verify a hand-made signature with the
                # agent's gpg.program, which then ran as the verifier
                "GIT_CONFIG_KEY_2": "log.showSignature", "GIT_CONFIG_VALUE_2": "false",
                "GIT_CONFIG_KEY_3": "gpg.program", "GIT_CONFIG_VALUE_3": "false",
                # installers the tests run read no configuration the agent could leave in the working folder
                # (a uv.toml / [tool.uv] with find-links to the agent's own `pytest` wheel)
                "UV_NO_CONFIG": "1", "PIP_CONFIG_FILE": os.devnull,
                # `uv venv X` over a folder X the agent left keeps its files (uv 0.9): Terminal-Bench's
                # harness then ran the agent's bin/pytest or a .pth file of its site-packages as the verifier
                "UV_VENV_CLEAR": "1"})
    if plugin:
        env["PYTEST_PLUGINS"] = plugin
    if safe_path:
        env["PYTHONSAFEPATH"] = "1"
    if not plugin_autoload:
        env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    return env, notes


def verifier_files(scratch: Path, plugin: str) -> list[tuple[Path, str, bool]]:
    """place() entries: the record plugin as module `plugin` (read-only), the verifier's HOME and
    records folder and a fresh Harbor reward folder (the verifier's own, each replacing whatever was
    there)."""
    lib = scratch / "lib"
    lib.mkdir(parents=True)
    (lib / f"{plugin}.py").write_bytes(PLUGIN.read_bytes())
    empty = scratch / "empty"
    empty.mkdir()
    return [(lib, LIB, True), (empty, HOME, False), (empty, RECORDS, False), (empty, REWARD_FOLDER, False)]


# --- what pytest decided --------------------------------------------------------------------

@dataclass
class PytestRecord:
    exitstatus: int
    tests: dict[str, str]
    plugins: list[str]                  # every plugin and conftest.py file pytest loaded
    inifile: str | None = None          # the configuration file it read (addopts, plugins, collection)


def read_records(sandbox: Sandbox) -> tuple[list[PytestRecord], list[str]]:
    """The records pytest wrote this session, and the problems with any that could not be read."""
    records, problems = [], []
    with tempfile.TemporaryDirectory() as folder:
        try:
            sandbox.copy_out(RECORDS, Path(folder) / "records")
        except SandboxError:
            return [], []
        for path in sorted((Path(folder) / "records").glob("session-*.json")):
            try:
                if path.stat().st_size > READ_LIMIT:
                    raise ValueError(f"larger than {READ_LIMIT} bytes")
                data = json.loads(path.read_text())
                records.append(PytestRecord(int(data["exitstatus"]), {str(k): str(v) for k, v in data["tests"].items()},
                                            [str(p) for p in data["plugins"]],
                                            str(data["inifile"]) if data.get("inifile") else None))
            except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as err:
                problems.append(f"pytest record {path.name} is not readable: {type(err).__name__}: {err}")
    return records, problems


PASSING = {"passed", "xfailed", "xpassed", "skipped"}


def foreign_plugins(records: list[PytestRecord], writable: list[str], allowed: list[str],
                    unchanged: Callable[[str], bool] = lambda path: False,
                    wrote: Callable[[str], bool] = lambda path: False,
                    verifier_made: Callable[[str], bool] = lambda path: False) -> list[str]:
    """Plugin, conftest.py or configuration files pytest used from where the agent could write (its
    folders, or with root inside any file it wrote: `wrote`), or conftest.py files outside the folders
    the task's own tests are in (`allowed`); a file the task itself placed there and the agent left as
    it was (`unchanged`) is the task's own, and one the verifier's processes made in the agent's
    folders after the hand-over (`verifier_made`, hand_over.py: a test harness's own venv) the verifier's."""
    found = set()
    for record in records:
        for path in record.plugins + ([record.inifile] if record.inifile else []):
            if ((_within(path, writable) and not verifier_made(path)) or wrote(path)
                    or (os.path.basename(path) == "conftest.py" and not _within(path, allowed))) \
                    and not unchanged(path):
                found.add(path)
    return sorted(found)


def pytest_grade(records: list[PytestRecord], problems: list[str], output_has_results: bool,
                 writable: list[str], allowed_conftests: list[str],
                 unchanged: Callable[[str], bool] = lambda path: False,
                 wrote: Callable[[str], bool] = lambda path: False,
                 verifier_made: Callable[[str], bool] = lambda path: False) -> tuple[bool, str, str | None]:
    """(resolved, why, verifier error): resolved when pytest's own record lists tests, none failed,
    and its exit status agrees."""
    if problems:
        return False, problems[0], problems[0]
    if not records:
        why = "pytest wrote no record (the tests did not run pytest to its end)"
        if output_has_results:   # a summary on stdout without a session behind it
            return False, why, why + ", yet the output shows pytest results: they are not trusted"
        return False, why, None
    foreign = foreign_plugins(records, writable, allowed_conftests, unchanged, wrote, verifier_made)
    if foreign:
        error = f"{FOREIGN}: {', '.join(foreign[:5])}"
        return False, error, error
    tests: dict[str, str] = {}
    for record in records:
        failing = [t for t, outcome in record.tests.items() if outcome not in PASSING]
        if record.exitstatus == 0 and failing:
            error = f"pytest exited 0 but its record has failures ({', '.join(failing[:3])})"
            return False, error, error
        if record.exitstatus == 1 and not failing:
            error = "pytest exited 1 (tests failed) but its record has no failure"
            return False, error, error
        tests.update(record.tests)
    failed = [t for t, outcome in tests.items() if outcome not in PASSING]
    bad_exit = [r.exitstatus for r in records if r.exitstatus != 0]
    if not tests:
        return False, "pytest ran no test", None
    if failed:
        return False, f"{len(failed)} of {len(tests)} tests failed: {', '.join(failed[:5])}", None
    if bad_exit:
        return False, f"pytest exited {bad_exit[0]}", None
    return True, f"{len(tests)} tests passed (pytest's record)", None


# --- reward files -----------------------------------------------------------------------------

def reward_file(sandbox: Sandbox, low: float = 0.0, high: float = 1.0) -> tuple[float, str, str | None]:
    """Harbor's reward.txt (one number) or reward.json ({"reward": x} or a number), read after the tests
    ended: (reward, why, verifier error)."""
    with tempfile.TemporaryDirectory() as folder:
        for name in ("reward.txt", "reward.json"):
            target = Path(folder) / name
            try:
                sandbox.copy_out(f"{REWARD_FOLDER}/{name}", target)
            except SandboxError:
                continue
            if target.stat().st_size > READ_LIMIT:
                error = f"{REWARD_FOLDER}/{name} is larger than {READ_LIMIT} bytes"
                return 0.0, error, error
            text = target.read_text(errors="replace").strip()
            try:
                value = json.loads(text) if name.endswith(".json") else float(text)
                if isinstance(value, dict) and "reward" not in value:
                    # several named rewards: Harbor's RL reward is the one named `reward`, else 0
                    error = (f"{REWARD_FOLDER}/{name} names rewards {', '.join(sorted(map(str, value))[:5])} but "
                             "none `reward` (the one a run trains on, as in Harbor)")
                    return 0.0, error, error
                if isinstance(value, dict):
                    value = value["reward"]
                if isinstance(value, bool) or not isinstance(value, (int, float)):
                    raise ValueError("not a number")
                value = float(value)
            except (ValueError, KeyError, TypeError, RecursionError) as err:
                error = f"{REWARD_FOLDER}/{name} does not hold one number ({type(err).__name__}): {text[:80]!r}"
                return 0.0, error, error
            if not math.isfinite(value) or not low <= value <= high:
                error = f"{REWARD_FOLDER}/{name} holds {value!r}, outside the task's reward range [{low:g}, {high:g}]"
                return 0.0, error, error
            return value, f"reward {value:g} from {name}", None
    error = f"the tests wrote no {REWARD_FOLDER}/reward.txt or reward.json"
    return 0.0, error, error


# --- suspicion ------------------------------------------------------------------------------

def task_placed(files: list[tuple[Path, str]]) -> dict[str, str]:
    """inside path -> sha256 of every file a task's set-up placed (its own conftest.py is not suspicious)."""
    placed = {}
    for source, target in files:
        source = Path(source)
        items = [(p, target.rstrip("/") + "/" + str(p.relative_to(source))) for p in source.rglob("*")] \
            if source.is_dir() else [(source, target)]
        for path, inside in items:
            if path.is_file() and not path.is_symlink():
                placed[os.path.normpath(inside)] = _sha256(str(path))
    return placed


def shadows_test_machinery(name: str, is_dir: bool, executable: bool) -> bool:
    """Whether a file or folder of this name would stand in for test machinery on a search path."""
    if is_dir:
        return name in SHADOW_PACKAGES
    return (name in SHADOW_FILES or name.endswith(".pth")
            or (executable and (name in SHADOW_PROGRAMS or name.startswith("python3."))))


def shadowing_files(sandbox: Sandbox, placed: dict[str, str], limit: int = 50) -> list[str]:
    """What in the workspace (the folders the agent could write that outlive its commands) would stand in
    for test machinery: pytest.py, a pytest/ package, conftest.py other than the task's own,
    sitecustomize / usercustomize, .pth files, executables named like interpreters or test runners, an
    installed distribution that registers a pytest plugin (entry_points.txt with [pytest11])."""
    found = []
    folders_on_host = sandbox.writable_host_folders()
    if not folders_on_host:
        return _shadowing_inside(sandbox, placed, limit)
    for inside, host in folders_on_host.items():
        for folder, name, info in host_paths.walk(host):
            path = os.path.join(folder, name)
            is_dir, regular = stat.S_ISDIR(info.st_mode), stat.S_ISREG(info.st_mode)
            plugin = name == "entry_points.txt" and regular and declares_pytest_plugin(path)
            if not plugin and not shadows_test_machinery(name, is_dir, regular and bool(info.st_mode & 0o111)):
                continue
            shown = os.path.normpath(os.path.join(inside, os.path.relpath(path, host)))
            if name == "conftest.py" and placed.get(shown) == _sha256(path):
                continue
            found.append(shown)
            if len(found) >= limit:
                return sorted(found)
    return sorted(found)


def unchanged_check(sandbox: Sandbox, placed: dict[str, str]) -> Callable[[str], bool]:
    """Whether an inside path holds exactly what the task placed there (read from the sandbox's host
    folders; a kind without them cannot tell, so nothing counts as unchanged)."""
    folders = sandbox.writable_host_folders()

    def unchanged(inside: str) -> bool:
        inside = os.path.normpath(inside)
        if inside not in placed:
            return False
        for mount, host in folders.items():
            if _within(inside, [mount]):
                return _sha256(os.path.join(host, os.path.relpath(inside, mount))) == placed[inside]
        return False
    return unchanged


def copied_unchanged(sandbox: Sandbox, placed: dict[str, str]) -> Callable[[str], bool]:
    """Whether an inside path holds exactly what dockyard placed there, read back out of the sandbox
    (for folders without a host copy, e.g. the verifier's writable /tests in podman)."""
    def unchanged(inside: str) -> bool:
        inside = os.path.normpath(inside)
        if inside not in placed:
            return False
        with tempfile.TemporaryDirectory() as folder:
            try:
                sandbox.copy_out(inside, Path(folder) / "file")
            except SandboxError:
                return False
            return _sha256(os.path.join(folder, "file")) == placed[inside]
    return unchanged


def _shadowing_inside(sandbox: Sandbox, placed: dict[str, str], limit: int) -> list[str]:
    """The same, found by a `find` in the sandbox (a kind whose workspace is not a host folder)."""
    names = " -o ".join(f"-name {shlex.quote(n)}" for n in sorted(SHADOW_FILES) + ["*.pth"])
    packages = " -o ".join(f"-name {shlex.quote(n)}" for n in sorted(SHADOW_PACKAGES))
    programs = " -o ".join(f"-name {shlex.quote(n)}" for n in sorted(SHADOW_PROGRAMS) + ["python3.*"])
    roots = " ".join(shlex.quote(r) for r in sandbox.agent_writable())
    result = sandbox.run(f"find {roots} -xdev \\( -type f \\( {names} \\) -o -type d \\( {packages} \\) -o -type f "
                         f"-perm -u+x \\( {programs} \\) \\) -print 2>/dev/null | head -n {limit}; "
                         f"find {roots} -xdev -type f -name entry_points.txt -exec grep -l '\\[pytest11\\]' {{}} + "
                         f"2>/dev/null | head -n {limit}; "
                         f"for f in $(find {roots} -xdev -type f -name conftest.py 2>/dev/null | head -n {limit}); "
                         "do sha256sum \"$f\"; done", timeout_s=60)
    hashes = dict(reversed(line.split(None, 1)) for line in result.output.splitlines() if "  /" in line)
    return sorted({line for line in result.output.splitlines() if line.startswith("/") and
                   not (line.endswith("/conftest.py") and placed.get(line) == hashes.get(line))})


def declares_pytest_plugin(path: str) -> bool:
    """An installed distribution's entry_points.txt that registers a pytest plugin (autoloaded)."""
    try:
        with open(path, "rb") as data:
            return b"[pytest11]" in data.read(READ_LIMIT)
    except OSError:
        return False


def _sha256(path: str) -> str | None:
    try:
        with open(path, "rb") as data:
            return hashlib.sha256(data.read(READ_LIMIT)).hexdigest()
    except OSError:
        return None
