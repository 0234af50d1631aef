"""SWE tasks in the two published row formats, read into one `SweTask`, and their repositories.

SWE-bench (and SWE-Gym, SWE-bench Verified/Lite: the same columns), one jsonl row per task:
    instance_id, repo ("owner/name"), base_commit, problem_statement, patch (the reference fix),
    test_patch (the tests that show the fix), FAIL_TO_PASS and PASS_TO_PASS (JSON-encoded lists of
    test ids, `tests/test_x.py::test_name`), hints_text, version, created_at, environment_setup_commit;
    SWE-bench_oracle's files add `text` (the issue with the code of the files to change).
SWE-bench Pro: the same core with lower-case fail_to_pass / pass_to_pass, plus requirements,
    interface, repo_language, before_repo_set_cmd (shell lines that put the repository in its
    starting state) and selected_test_files_to_run (a JSON list of the test files to run).

The test directives are the Pro row's selected test files, else what the official harness derives
from the test patch (swe_harness.py: test files only, by their new names, django's as module paths);
the command that runs them is chosen by the scorer (swe.test_command), unless the row has its own
`test_cmd` (this project's addition, for repositories the harness does not know).

Repositories are not downloaded: `owner/name` is looked up in the repos folder (env.repos_dir; by
default `repos/` beside the task file) as `owner__name.bundle` (a git bundle), `owner__name/` or
`owner/name/` (a clone), and checked out at base_commit.
"""

from __future__ import annotations

import ast
import atexit
import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from dockyard.envs import swe_harness
from dockyard.errors import DockyardError
from dockyard.sandboxes.owners import owner_token
from dockyard.sandboxes.reaping import SWE_REPOS_PREFIX

PYTEST = "python3 -m pytest -rA -p no:cacheprovider"
TESTBED = "/testbed"
PRO_REPO_DIR = "/app"
_DIFF_PATH = re.compile(r"^(?:diff --git a/(\S+) b/(\S+)|--- a/(\S+)|\+\+\+ b/(\S+)|rename (?:from|to) (\S+))",
                        re.MULTILINE)


class SweTaskError(DockyardError, ValueError):
    """A task row or repository that cannot be used; the message names the file and the task."""


@dataclass
class SweTask:
    instance_id: str
    repo: str
    base_commit: str
    problem_statement: str
    patch: str                 # the reference fix (what the oracle submits)
    test_patch: str
    fail_to_pass: list[str]
    pass_to_pass: list[str]
    test_files: list[str]      # the test directives: Pro's selected test files, else the harness's from the test patch
    own_test_command: str      # the row's test_cmd (this project's addition), "" when the harness decides
    setup_command: str         # SWE-bench Pro's before_repo_set_cmd ("" for SWE-bench)
    source: str                # the task file (and line), for messages
    task_file: str             # the task file, which the default repos folder is beside
    row: dict                  # the row as read (what a scoring server is sent)

    @property
    def where(self) -> str:
        return f"{self.source}: task {self.instance_id}"

    @property
    def is_pro(self) -> bool:
        return "selected_test_files_to_run" in self.row or "before_repo_set_cmd" in self.row

    @property
    def repo_dir(self) -> str:
        """Where the repository is in the sandbox: SWE-bench's images keep it in /testbed, SWE-bench Pro's
        in /app (its run scripts `cd /app`)."""
        return PRO_REPO_DIR if self.is_pro else TESTBED


def patch_files(patch: str) -> list[str]:
    """Every path a unified diff names (either side, renames included), in order, once."""
    seen: dict[str, None] = {}
    for match in _DIFF_PATH.finditer(patch):
        for path in match.groups():
            if path and path != "/dev/null":
                seen.setdefault(path, None)
    return list(seen)


def _test_ids(row: dict, names: tuple[str, ...], where: str) -> list[str]:
    for name in names:
        if name in row:
            value = row[name]
            if isinstance(value, str):
                try:
                    value = json.loads(value) if value.strip() else []
                except json.JSONDecodeError as err:
                    try:   # SWE-bench Pro publishes Python's repr of the list: ['a', 'b']
                        value = ast.literal_eval(value)
                    except (ValueError, SyntaxError, MemoryError, RecursionError):
                        raise SweTaskError(f"{where}: {name} is not a JSON (or Python) list of test ids ({err.msg})") \
                            from None
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise SweTaskError(f"{where}: {name} must be a list of test ids, got {type(value).__name__}")
            return value
    raise SweTaskError(f"{where}: no {' / '.join(names)} column")


def task_from_row(row: dict, task_file: str, line: int | None = None) -> SweTask:
    """One row of either format; a row that cannot be scored is refused, naming the file, the task and the column."""
    instance_id = row.get("instance_id")
    source = f"{task_file}:{line}" if line else str(task_file)
    where = f"{source}: task {instance_id}" if instance_id else f"{source}: a row without instance_id"
    if not isinstance(instance_id, str) or not instance_id:
        raise SweTaskError(f"{where}: no instance_id")
    for key in ("repo", "base_commit", "test_patch"):
        if not isinstance(row.get(key), str) or not row[key].strip():
            raise SweTaskError(f"{where}: no {key}")
    fail_to_pass = _test_ids(row, ("FAIL_TO_PASS", "fail_to_pass"), where)
    pass_to_pass = _test_ids(row, ("PASS_TO_PASS", "pass_to_pass"), where)
    if not fail_to_pass:
        raise SweTaskError(f"{where}: FAIL_TO_PASS is empty: no test shows the fix")
    selected = row.get("selected_test_files_to_run")
    test_files = (_test_ids(row, ("selected_test_files_to_run",), where) if selected
                  else swe_harness.test_directives(row))
    command = row.get("test_cmd") or ""
    if not isinstance(command, str):
        raise SweTaskError(f"{where}: test_cmd must be a shell command, got {type(command).__name__}")
    return SweTask(instance_id, row["repo"], row["base_commit"], str(row.get("problem_statement", "")),
                   str(row.get("patch") or ""), row["test_patch"], fail_to_pass, pass_to_pass, test_files,
                   command, str(row.get("before_repo_set_cmd") or ""), source, str(task_file), row)


def read_task_file(path: str | Path) -> tuple[list[SweTask], list[str]]:
    """Every task of a jsonl file and, apart, one message per row that could not be read."""
    path = Path(path)
    try:
        lines = path.read_text().splitlines()
    except OSError as err:
        raise SweTaskError(f"{path}: cannot read it ({err.strerror})") from None
    tasks, problems = [], []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            if not isinstance(row, dict):
                raise SweTaskError(f"{path}:{number}: a row must be a JSON object")
            tasks.append(task_from_row(row, str(path), number))
        except json.JSONDecodeError as err:
            problems.append(f"{path}:{number}: not JSON ({err.msg})")
        except SweTaskError as err:
            problems.append(str(err))
    return tasks, problems


class RepoStore:
    """Checked-out repositories, one folder per (repo, commit), made once per process and copied into
    each sandbox."""

    def __init__(self, repos_dir: str | Path | None):
        self.repos_dir = Path(repos_dir) if repos_dir else None
        # named for its owner: a run that dies leaves it, and the next one reaps it (sandboxes/reaping.py)
        self._scratch = Path(tempfile.mkdtemp(prefix=f"{SWE_REPOS_PREFIX}{owner_token()}-"))
        self._ready: dict[tuple[str, str], Path] = {}
        self._lock = threading.Lock()
        atexit.register(self.close)

    def folder_for(self, task: SweTask) -> Path:
        return self.repos_dir or Path(task.task_file).resolve().parent / "repos"

    def source_of(self, task: SweTask) -> Path:
        folder = self.folder_for(task)
        owner_name = task.repo.replace("/", "__")
        candidates = [folder / f"{owner_name}.bundle", folder / owner_name, folder / task.repo]
        for candidate in candidates:
            if candidate.exists():
                return candidate
        raise SweTaskError(f"{task.where}: repository {task.repo} not found: looked for "
                           f"{', '.join(str(c) for c in candidates)} (env.repos_dir)")

    def checkout(self, task: SweTask) -> Path:
        key = (task.repo, task.base_commit)
        with self._lock:
            if key not in self._ready:
                self._ready[key] = self._clone(task)
            return self._ready[key]

    def _git(self, argv: list[str], task: SweTask, what: str, timeout_s: float = 300) -> subprocess.CompletedProcess:
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "GIT_CONFIG_GLOBAL": "/dev/null",
               "GIT_TERMINAL_PROMPT": "0", "HOME": str(self._scratch)}
        try:
            return subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, env=env)
        except subprocess.TimeoutExpired:
            raise SweTaskError(f"{task.where}: {what} took over {timeout_s:.0f} s") from None

    def export(self, task: SweTask, target: Path) -> None:
        """The repository at base_commit in `target` with only the history up to it: no branch, tag or
        object of later commits, where the reference fix would be one `git log --all` away. The tags of
        earlier commits stay (as the harness keeps them): setuptools-scm versions the package from them."""
        checkout = self.checkout(task)
        upload = "git -c uploadpack.allowAnySHA1InWant=true upload-pack"
        for argv in (["git", "init", "-q", str(target)],
                     ["git", "-C", str(target), "fetch", "-q", "--no-tags", f"--upload-pack={upload}", str(checkout),
                      task.base_commit],
                     ["git", "-C", str(target), "-c", "advice.detachedHead=false", "checkout", "-q", "-B", "main",
                      "FETCH_HEAD"]):
            done = self._git(argv, task, f"exporting {task.repo} at {task.base_commit[:12]}")
            if done.returncode != 0:
                incomplete = re.search(r"unable to read|missing (blob|tree|object)|corrupt", done.stderr)
                raise SweTaskError(f"{task.where}: cannot export {task.repo} at {task.base_commit}: "
                                   + ("the repository store lacks objects that commit needs (an incomplete copy, "
                                      "such as a snapshot without its large files): " if incomplete else "")
                                   + (done.stderr.strip()[-300:] or "git failed"))
        merged = self._git(["git", "-C", str(checkout), "tag", "--merged", task.base_commit], task, "listing tags")
        tags = [f"refs/tags/{tag}:refs/tags/{tag}" for tag in merged.stdout.split()]
        if tags:
            self._git(["git", "-C", str(target), "fetch", "-q", "--no-tags", f"--upload-pack={upload}", str(checkout),
                       *tags], task, f"copying the tags of {task.repo}")

    def bundle(self, task: SweTask, exported: Path, target: Path) -> None:
        """An exported repository (export()) as a git bundle of its branch and tags, the same bytes for
        the same commits (one packing thread)."""
        done = self._git(["git", "-C", str(exported), "-c", "pack.threads=1", "bundle", "create", "-q", str(target),
                          "main", "--tags"], task, f"bundling {task.repo}")
        if done.returncode != 0:
            raise SweTaskError(f"{task.where}: cannot bundle {task.repo} at {task.base_commit}: "
                               f"{done.stderr.strip()[-300:] or 'git failed'}")

    def read_at(self, task: SweTask, commit: str, path: str) -> str | None:
        """A file of the repository at `commit` (None when either is not there)."""
        done = self._git(["git", "-C", str(self.checkout(task)), "show", f"{commit}:{path}"], task,
                         f"reading {path} at {commit[:12]}", 60)
        return done.stdout if done.returncode == 0 else None

    def _clone(self, task: SweTask) -> Path:
        source = self.source_of(task)
        target = self._scratch / f"{task.repo.replace('/', '__')}-{task.base_commit[:12]}"
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "GIT_CONFIG_GLOBAL": "/dev/null",
               "GIT_TERMINAL_PROMPT": "0", "HOME": str(self._scratch)}
        steps = [["git", "clone", "-q", "--no-checkout", str(source), str(target)],
                 ["git", "-C", str(target), "-c", "advice.detachedHead=false", "checkout", "-q", task.base_commit]]
        for argv in steps:
            try:
                done = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env)
            except subprocess.TimeoutExpired:
                raise SweTaskError(f"{task.where}: `{' '.join(argv[:2])}` of {source} took over 300 s") from None
            if done.returncode != 0:
                shutil.rmtree(target, ignore_errors=True)
                raise SweTaskError(f"{task.where}: cannot check out {task.base_commit} of {source}: "
                                   f"{done.stderr.strip().splitlines()[-1] if done.stderr.strip() else 'git failed'}")
        return target

    def close(self) -> None:
        shutil.rmtree(self._scratch, ignore_errors=True)
