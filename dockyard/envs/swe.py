"""`swe`: SWE-bench style repository tasks. Single shot (env.agent null): the model reads an issue (and
whatever code the prompt column carries) and answers with one patch. Agentic (env.agent tool_calling):
the agent works in a sandbox holding the repository at base_commit (/testbed) through a shell, and the
diff it leaves against base_commit is its patch. Either way the patch is scored in a fresh sandbox by
the task's own tests, the way the SWE-bench harness does it.

A dataset row is a task in SWE-bench's or SWE-bench Pro's columns (swe_tasks.py); set the dataset's
metadata_key to null so the environment gets the whole row. Scoring one patch:
  1. integrity check (env.integrity_check): a patch that touches a test file, one the task's test
     patch touches or one named like a test (tests/, test_*.py, *_test.py, conftest.py, pytest.ini),
     that adds a file shadowing test machinery (pytest.py, a pytest/ package, sitecustomize.py,
     usercustomize.py, a .pth file, an executable named like an interpreter or test runner) or
     touches .git/, scores 0 and is flagged, before anything runs;
  2. a fresh sandbox with the repository checked out at base_commit in /testbed, the Pro row's
     before_repo_set_cmd run there;
  3. the patch applied (`git apply`, then `patch --fuzz=5` as the harness falls back); one that does
     not apply scores 0;
  4. the test files reset to base_commit and the task's test patch applied, so nothing the patch did
     to them counts;
  5. the tests run (at most env.sandbox.command_exec_timeout_s) in the verifier's environment
     (grading.py: no user site, HOME outside the repository, git hooks off), and each test's status
     comes from the record pytest itself writes where only the verifier writes: a -rA summary on
     stdout never pays, and a plugin loaded from a file the patch touched is refused.
Reward (env.reward_mode): `binary` is 1 when every FAIL_TO_PASS and PASS_TO_PASS test passes, else 0;
`tests_pass` is the fraction of FAIL_TO_PASS tests that pass, 0 if any PASS_TO_PASS test fails.
Patches are scored env.num_workers at a time, each within env.task_timeout_s.

Extra env keys: reward_mode (binary | tests_pass; binary), integrity_check (true), repos_dir (the
folder of repositories; default: `repos/` beside the task file), run_scripts_dir (SWE-bench Pro's
run_scripts/ folder, swe_pro.py; default: `run_scripts/` beside the task file), sandbox_urls (scoring servers on
other machines, swe_server.py; default: score here) with scoring_secret_file (the secret they and
the run share); agentic: tool_format, max_output_chars (as terminal_bench).
"""

from __future__ import annotations

import os
import re
import shlex
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePosixPath

from dockyard.agents.tool_format import TERMINAL_TOOLS
from dockyard.config.schema.env import EnvConfig, SandboxConfig
from dockyard.data.datasets import Prompt, split_row_slice
from dockyard.envs import swe_harness, swe_pro
from dockyard.envs.grading import (SHADOW_PACKAGES, new_plugin_name, read_records, shadows_test_machinery,
                                   verifier_env, verifier_files)
from dockyard.envs.swe_environments import PYTHON_POLICIES, EnvironmentBuilder, RowEnvironment
from dockyard.envs.swe_pro import RunScripts
from dockyard.envs.swe_scoring_client import RemoteScorers, ScoringServerError, read_secret
from dockyard.envs.swe_tasks import (PYTEST, RepoStore, SweTask, SweTaskError, patch_files, read_task_file,
                                     task_from_row)
from dockyard.envs.terminal_bench import ShellEpisode
from dockyard.envs.terminal_trial import TrialResult
from dockyard.errors import DockyardError
from dockyard.sandboxes.base import SandboxError, SandboxSpec
from dockyard.sandboxes.factory import SandboxFactory

REWARD_MODES = ("binary", "tests_pass")
PASSING = ("passed", "xfailed")   # SWE-bench counts an expected failure as passing (a skip as not)
TEST_DIRS = {"test", "tests", "testing"}
TEST_CONFIG_FILES = {"conftest.py", "pytest.ini"}

_TAGGED = re.compile(r"<patch>\n?(.*?)</patch>", re.DOTALL)
_FENCED = re.compile(r"```(?:diff|patch)[^\n]*\n(.*?)```", re.DOTALL)
_BARE = re.compile(r"^(?:diff --git |--- a/|--- /dev/null)", re.MULTILINE)


def extract_patch(completion: str) -> str | None:
    """The unified diff in a reply: inside <patch> tags, a ```diff block, or from its first diff
    header to the end; None when the reply holds none."""
    for pattern in (_TAGGED, _FENCED):
        match = pattern.search(completion)
        if match and _BARE.search(match.group(1)):
            body = match.group(1)
            return body[_BARE.search(body).start():].rstrip("\n") + "\n"
    match = _BARE.search(completion)
    if match is None:
        return None
    return completion[match.start():].split("```")[0].rstrip("\n") + "\n"


def looks_like_test(path: str) -> bool:
    parts = PurePosixPath(path).parts
    name = parts[-1] if parts else path
    return (any(part in TEST_DIRS for part in parts[:-1]) or name in TEST_CONFIG_FILES
            or name.startswith("test_") or name.endswith("_test.py"))


def edited_tests(task: SweTask, patch: str) -> list[str]:
    """The test files a patch touches."""
    protected = set(patch_files(task.test_patch)) | set(task.test_files)
    return [path for path in patch_files(patch) if path in protected or looks_like_test(path)]


_FILE_HEADER = re.compile(r"^diff --git a/\S+ b/(\S+)|^\+\+\+ b/(\S+)")
_NEW_MODE = re.compile(r"^(?:new file mode|new mode) (\d+)")


def added_files(patch: str) -> dict[str, bool]:
    """The files a patch adds or makes executable: path -> executable."""
    found: dict[str, bool] = {}
    current, new = None, False
    for line in patch.splitlines():
        header = _FILE_HEADER.match(line)
        if header:
            current = header.group(1) or header.group(2)
            if line.startswith("+++") and new:
                found.setdefault(current, False)
            continue
        if line.startswith("--- "):
            new = line.strip() == "--- /dev/null"
        mode = _NEW_MODE.match(line)
        if mode and current:
            found[current] = found.get(current, False) or bool(int(mode.group(1), 8) & 0o111)
    return found


def shadowing_paths(patch: str) -> list[str]:
    """What a patch adds that would stand in for test machinery, and anything it does to .git/."""
    flagged = [path for path in patch_files(patch) if path == ".git" or path.startswith(".git/")]
    for path, executable in added_files(patch).items():
        parts = PurePosixPath(path).parts
        if shadows_test_machinery(parts[-1], False, executable) or any(part in SHADOW_PACKAGES for part in parts[:-1]):
            flagged.append(path)
    return flagged


def runner_files(command: str, patch: str) -> list[str]:
    """Files of the repository the test command runs as its program (sympy's bin/test, django's
    tests/runtests.py) that a patch touches: their output is what the harness's parsers read."""
    programs = {os.path.normpath(word) for word in shlex.split(command, posix=True)
                if "/" in word and not word.startswith(("/", "-")) and "=" not in word}
    return [path for path in patch_files(patch) if os.path.normpath(path) in programs]


def integrity_findings(task: SweTask, patch: str, command: str = "") -> list[str]:
    """The integrity check: test files a patch touches, the test runner's program, and what it adds that
    shadows test machinery."""
    return list(dict.fromkeys(edited_tests(task, patch) + runner_files(command, patch) + shadowing_paths(patch)))


@dataclass
class SweResult:
    reward: float
    resolved: bool = False
    applied: bool = False
    flagged: list[str] = field(default_factory=list)   # test files the patch touched (integrity check)
    statuses: dict[str, str] = field(default_factory=dict)
    log: str = ""
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)   # how the row's environment differs from the harness's
    tests_ran: str | None = None   # "pytest record", "runner log" (the harness's parser over its output), "no"


def row_sandbox(task: SweTask, repos: RepoStore, environments: EnvironmentBuilder | None
                ) -> tuple[SandboxSpec, RowEnvironment | None]:
    """The row's own environment (env.sandbox.task_images: build), else its checkout on the sandbox's."""
    if environments is not None:
        row = environments.environment_for(task)
        return SandboxSpec(workdir=task.repo_dir, env=dict(row.image.env), name=f"task {task.instance_id}",
                           image=row.image.tag, rootfs=row.image.rootfs), row
    return SandboxSpec(workdir=task.repo_dir, files=[(repos.checkout(task), task.repo_dir)],
                       name=f"task {task.instance_id}"), None


class SweScorer:
    """Scores patches for SWE tasks in fresh sandboxes (steps 1-5 of the module doc)."""

    def __init__(self, sandboxes: SandboxFactory, repos: RepoStore, reward_mode: str = "binary",
                 integrity_check: bool = True, environments: EnvironmentBuilder | None = None,
                 run_scripts: RunScripts | None = None):
        self.sandboxes, self.repos = sandboxes, repos
        self.reward_mode, self.integrity_check = reward_mode, integrity_check
        self.environments = environments
        self.run_scripts = run_scripts or RunScripts(None)

    def score(self, task: SweTask, patch: str) -> SweResult:
        started = time.monotonic()
        scripts = self.run_scripts.for_task(task)
        command = swe_pro.command(task) if scripts else command_for(task, built=self.environments is not None)
        flagged = integrity_findings(task, patch, command)
        if flagged and self.integrity_check:
            return SweResult(0.0, flagged=flagged, seconds=time.monotonic() - started,
                             log=f"integrity check: the patch edits test files, the test runner or adds what shadows "
                                 f"test machinery ({', '.join(flagged)}); scored 0")
        spec, row = row_sandbox(task, self.repos, self.environments)
        limit = self.sandboxes.limits.command_timeout_s
        with tempfile.TemporaryDirectory() as scratch, self.sandboxes.create(spec) as sandbox:
            Path(scratch, "model.patch").write_text(patch)
            Path(scratch, "test.patch").write_text(task.test_patch)
            sandbox.copy_in(Path(scratch), "/patches", read_only=True)
            notes, log = list(row.notes) if row else [], []
            if task.is_pro and not scripts:
                notes.append(f"no {self.run_scripts.folder_for(task) / task.instance_id}/run_script.sh: pytest ran "
                             "the row's selected test files (env.run_scripts_dir)")
            if task.setup_command.strip():
                setup = sandbox.run(task.setup_command, timeout_s=limit)
                log.append(setup.output)
                if not setup.ok:
                    raise SweTaskError(f"{task.where}: before_repo_set_cmd failed ({_status(setup)}): "
                                       f"{setup.output.strip()[-300:]}")
            if patch.strip():
                applied = sandbox.run("git apply -v /patches/model.patch || "
                                      "{ command -v patch >/dev/null && patch --batch --fuzz=5 -p1 -i /patches/model.patch; }",
                                      timeout_s=limit)
                log.append(applied.output)
                if not applied.ok:
                    return SweResult(0.0, flagged=flagged, seconds=time.monotonic() - started, notes=notes,
                                     log="\n".join(log) + "\n[the patch does not apply]")
            # the harness's reset: the files the test patch touches, as they were at base_commit
            reset = " ; ".join(f"{{ git checkout -q {task.base_commit} -- {shlex.quote(path)} 2>/dev/null || rm -f {shlex.quote(path)}; }}"
                               for path in patch_files(task.test_patch))
            tests_in = sandbox.run(f"{reset} ; git apply /patches/test.patch", timeout_s=limit)
            if not tests_in.ok:
                raise SweTaskError(f"{task.where}: its test_patch does not apply at base_commit "
                                   f"({_status(tests_in)}): {tests_in.output.strip()[-300:]}")
            plugin = new_plugin_name()
            env, _ = verifier_env(sandbox, {**spec.env, **(row.test_env if row else {})}, [], safe_path=False,
                                  plugin_autoload=True, plugin=plugin)
            sandbox.place(verifier_files(Path(scratch) / "verifier", plugin))
            if scripts:
                swe_pro.place_scripts(sandbox, scripts, Path(scratch))
            log.append(f"+ {command}")
            run = sandbox.run(command, timeout_s=limit, env=env, replace_env=True)
            sandbox.end_processes()
            log.append(run.output)
            records, problems = read_records(sandbox) if swe_harness.runs_pytest(command) else ([], [])
            logs = swe_pro.collect_logs(sandbox, Path(scratch)) if scripts else {}
        if scripts:   # the row's parser, in a sandbox of its own once the tests' sandbox is gone
            notes.append(f"tests run by the row's run_script.sh and read by its parser.py ({scripts.run_script.parent})")
            log.append("\n".join(f"[{name}]\n{data[-20000:].decode(errors='replace')}" for name, data in logs.items()))
            statuses, reason = swe_pro.parse(self.sandboxes, task, scripts, logs, limit)
            why = (reason, []) if reason else None
        else:
            statuses, why = self.statuses(task, command, patch, run.output, records, problems)
        if why:
            return SweResult(0.0, False, True, flagged + why[1], {}, "\n".join(log) + f"\n[verifier: {why[0]}; scored 0]",
                             time.monotonic() - started, notes, "no")
        if scripts:
            passed, broken = swe_pro.grade(task, statuses)
            resolved = len(passed) == len(task.fail_to_pass) and not broken
            resolution = "resolved" if resolved else "not resolved"
        else:
            report, resolution = swe_harness.grade(task.fail_to_pass, task.pass_to_pass, statuses)
            passed, broken = report["FAIL_TO_PASS"]["success"], report["PASS_TO_PASS"]["failure"]
            resolved = resolution == "RESOLVED_FULL"
        if self.reward_mode == "binary":
            reward = 1.0 if resolved else 0.0
        else:
            reward = 0.0 if broken else len(passed) / len(task.fail_to_pass)
        summary = (f"[FAIL_TO_PASS {len(passed)}/{len(task.fail_to_pass)} pass; PASS_TO_PASS "
                   f"{len(task.pass_to_pass) - len(broken)}/{len(task.pass_to_pass)} pass; {resolution}"
                   + (f"; tests timed out after {limit:.0f} s" if run.timed_out else "") + "]")
        return SweResult(reward, resolved, True, flagged, statuses, "\n".join(log) + "\n" + summary,
                         time.monotonic() - started, notes,
                         "row's parser" if scripts else "pytest record" if swe_harness.runs_pytest(command) else "runner log")

    @staticmethod
    def statuses(task: SweTask, command: str, patch: str, output: str, records, problems
                 ) -> tuple[dict[str, str], tuple[str, list[str]] | None]:
        """Each test's status in the harness's words, and (why, flagged files) when the run cannot be trusted.
        pytest runs: from the record pytest wrote where only the verifier writes, through the repository's
        parser (as a -rA summary); other runners (django's runtests.py, sympy's bin/test): the harness's
        parser over their output."""
        parser = swe_harness.log_parser(task.repo) or swe_harness.log_parser("pytest-dev/pytest")
        if not swe_harness.runs_pytest(command):
            return parser(output), None
        touched = {f"{task.repo_dir}/{path}" for path in patch_files(patch)}
        # plugins only: a patch may edit pyproject.toml or setup.cfg for its own reasons while pytest reads
        # them; the integrity check refuses pytest.ini and conftest.py edits
        foreign = sorted({p for record in records for p in record.plugins if os.path.normpath(p) in touched})
        if foreign or problems or not records:
            why = (f"pytest loaded a plugin from a file the patch touched ({', '.join(foreign)})" if foreign
                   else problems[0] if problems else "pytest wrote no record (the tests did not run pytest to its end)")
            return {}, (why, foreign)
        found: dict[str, str] = {}
        for record in records:
            found.update(record.tests)
        return parser(swe_harness.summary_from_record(found)), None


def command_for(task: SweTask, built: bool) -> str:
    """The row's own test_cmd; else, with the row's environment built, the harness's test command for the
    repository and version with its directives; else pytest over the directives on the sandbox's Python
    (the harness's command when it is not pytest)."""
    if task.own_test_command:
        return task.own_test_command
    spec = swe_harness.spec_for(task.repo, task.row.get("version"))
    directives = " ".join(shlex.quote(d) for d in task.test_files)
    if spec and (built or not swe_harness.runs_pytest(spec["test_cmd"])):
        return f"{spec['test_cmd']} {directives}"
    return f"{PYTEST} {directives}"


def _status(result) -> str:
    return f"timed out after {result.seconds:.0f} s" if result.timed_out else f"exit status {result.exit_code}"


class SweEnvironment:
    """SWE tasks, single shot (the reply is a patch) or agentic (the agent edits the repository in a
    sandbox; the diff it leaves is the patch). Either way the patch is scored by the task's tests."""

    multi_turn = None    # either way: single shot without env.agent, agentic with one
    task_images = True   # reads env.sandbox.task_images: build makes each row's environment (swe_environments.py)
    tools = TERMINAL_TOOLS
    AGENT_KEYS = frozenset({"tool_format", "max_output_chars"})
    EXTRA_KEYS = frozenset({"reward_mode", "integrity_check", "repos_dir", "sandbox_urls", "scoring_secret_file",
                            "python_versions", "run_scripts_dir"}) | AGENT_KEYS

    @classmethod
    def check_settings(cls, config: EnvConfig) -> dict:
        """The env settings, checked (ValueError naming the field); the preflight calls it too."""
        extra = dict(config.model_extra or {})
        unknown = sorted(set(extra) - cls.EXTRA_KEYS)
        if unknown:
            raise ValueError(f"env.{unknown[0]}: not a swe setting (known: {', '.join(sorted(cls.EXTRA_KEYS))})")
        agent_only = sorted(set(extra) & cls.AGENT_KEYS)
        if agent_only and config.agent is None:
            raise ValueError(f"env.{agent_only[0]}: a setting of the agentic swe (env.agent); single shot has no tools")
        swe_harness.spec_for("django/django", "4.2")   # the harness is importable (else: how to install it)
        policy = extra.get("python_versions")
        if policy is not None:
            if policy not in PYTHON_POLICIES:
                raise ValueError(f"env.python_versions: {policy!r} is not one of {', '.join(PYTHON_POLICIES)}")
            if config.sandbox is None or config.sandbox.task_images != "build":
                raise ValueError("env.python_versions: only per-row environments read it (env.sandbox.task_images: "
                                 "build); remove it")
        scripts = extra.get("run_scripts_dir")
        if scripts is not None and (not isinstance(scripts, str) or not Path(scripts).is_dir()):
            raise ValueError(f"env.run_scripts_dir: {scripts!r} is not a folder (SWE-bench Pro's run_scripts/, "
                             "one <instance_id>/run_script.sh and parser.py per row)")
        mode = extra.get("reward_mode", "binary")
        if mode not in REWARD_MODES:
            raise ValueError(f"env.reward_mode: {mode!r} is not one of {', '.join(REWARD_MODES)}")
        integrity = extra.get("integrity_check", True)
        if not isinstance(integrity, bool):
            raise ValueError(f"env.integrity_check: must be true or false, got {integrity!r}")
        urls = extra.get("sandbox_urls") or []
        if not isinstance(urls, list) or not all(isinstance(u, str) and u.startswith(("http://", "https://"))
                                                 for u in urls):
            raise ValueError(f"env.sandbox_urls: must be a list of http(s) URLs of scoring servers, got {urls!r}")
        if urls:
            read_secret(extra.get("scoring_secret_file"))
        elif extra.get("scoring_secret_file"):
            raise ValueError("env.scoring_secret_file: only scoring servers (env.sandbox_urls) read it; remove it")
        return extra

    def __init__(self, config: EnvConfig):
        extra = self.check_settings(config)
        mode, integrity = extra.get("reward_mode", "binary"), extra.get("integrity_check", True)
        urls = extra.get("sandbox_urls") or []
        self.multi_turn = config.agent is not None
        self.config = config
        repos_dir = extra.get("repos_dir")
        self.repos_dir = str(Path(repos_dir).resolve()) if repos_dir else None
        self.repos = RepoStore(repos_dir)
        self.tool_format = str(extra.get("tool_format", "auto"))
        self.max_output_chars = int(extra.get("max_output_chars", 4000))
        # the agent's sandboxes are here; with scoring servers the scoring sandboxes are theirs
        # (env.sandbox applies there), so a single-shot run with servers makes none here
        self.sandboxes = (SandboxFactory(config.sandbox or SandboxConfig()) if self.multi_turn or not urls else None)
        self.remote = RemoteScorers(urls, config.task_timeout_s, read_secret(extra.get("scoring_secret_file"))) \
            if urls else None
        self.environments = EnvironmentBuilder.for_config(self.sandboxes, self.repos, config)
        self.scorer = None if urls else SweScorer(self.sandboxes, self.repos, mode, integrity, self.environments,
                                                  RunScripts(extra.get("run_scripts_dir")))
        self.reward_mode, self.integrity_check = mode, integrity
        self._tasks: dict[tuple[str, str], SweTask] = {}
        self._lock = threading.Lock()

    @property
    def capacity(self) -> int | None:
        """Agentic episodes open at once: one sandbox each."""
        return self.sandboxes.config.max_concurrent if self.multi_turn else None

    def prepare_prompts(self, prompts: list[Prompt]) -> list[Prompt]:
        """Agentic: each issue with where the repository is and how to finish."""
        if not self.multi_turn:
            return prompts
        return [replace(p, input=str(p.input).rstrip() + f"\n\nThe repository is checked out in {self.task_for(p).repo_dir}, your "
                        "working directory. Change its code to resolve the issue, then submit. Leave the tests alone: "
                        "a file you change or add that is a test (under tests/, test_*.py, conftest.py) scores 0.")
                for p in prompts]

    def open(self, prompt: Prompt) -> "SweEpisode":
        return SweEpisode(self, self.task_for(prompt))

    def task_for(self, prompt: Prompt) -> SweTask:
        row = prompt.metadata
        if "instance_id" not in row:
            raise SweTaskError(f"dataset {prompt.source!r}: a swe row needs its SWE-bench instance as metadata; "
                               "set data.datasets[].metadata_key to null for flat SWE-bench rows")
        key = (prompt.source_file or prompt.source, str(row["instance_id"]))
        with self._lock:
            if key not in self._tasks:
                self._tasks[key] = task_from_row(row, key[0])
            return self._tasks[key]

    def judge(self, task: SweTask, patch: str) -> SweResult:
        """The patch scored here, or by the least-busy scoring server (env.sandbox_urls)."""
        if self.remote is None:
            return self.scorer.score(task, patch)
        answer = self.remote.score({"instance_id": task.instance_id, "patch": patch, "reward_mode": self.reward_mode,
                                    "integrity_check": self.integrity_check})
        return SweResult(float(answer["reward"]), bool(answer["resolved"]), bool(answer["applied"]),
                         list(answer["flagged"]), log=str(answer["log"]))

    def score(self, completion: str, prompt: Prompt) -> float:
        task = self.task_for(prompt)
        result = self.judge(task, extract_patch(completion) or "")
        if result.flagged and self.integrity_check:
            print(f"swe: {task.instance_id}: integrity check: a patch edits {', '.join(result.flagged)}; "
                  "scored 0", file=sys.stderr, flush=True)
        return result.reward

    def action_valid(self, completion: str) -> bool:
        """The action is the patch: invalid when the reply holds none (grpo.invalid_action_penalty applies)."""
        return extract_patch(completion) is not None

    @classmethod
    def reference_trials(cls, cfg, source: Path, agent: str, rebuild: bool = False) -> tuple[list[TrialResult], list[str]]:
        """`dockyard env check`: the oracle submits each task's reference patch, the no-op agent an
        empty one; bad rows are reported apart and the rest are checked (`rebuild`: each row's
        environment built again from nothing first)."""
        file, rows = split_row_slice(str(source))
        tasks, problems = read_task_file(file)
        if rows != slice(None):
            tasks = tasks[rows]
        env = cls(cfg.env)
        if env.environments is not None:
            env.environments.rebuild = rebuild

        def trial(task: SweTask) -> TrialResult:
            result = TrialResult(task.instance_id, 0.0, 0.0)
            try:
                scored = env.judge(task, task.patch if agent == "oracle" else "")
                result.reward, result.test_output, result.seconds = scored.reward, scored.log, scored.seconds
                result.tests_ran = scored.tests_ran
                result.notes += scored.notes
                if scored.flagged:
                    result.notes.append(f"integrity check flagged {', '.join(scored.flagged)}")
            except (SweTaskError, SandboxError, ScoringServerError) as err:
                result.error = str(err)
            return result

        try:
            with ThreadPoolExecutor(max_workers=cfg.env.num_workers) as pool:
                return list(pool.map(trial, tasks)), problems
        finally:
            env.repos.close()


    @classmethod
    def build_command(cls, cfg, source: Path, out=sys.stdout, rebuild: bool = False) -> int:
        """`dockyard env build`: every row's environment ahead of a run, one line per row (or again from
        nothing with `rebuild`); exit 1 if one fails."""
        file, rows = split_row_slice(str(source))
        tasks, problems = read_task_file(file)
        tasks = tasks[rows] if rows != slice(None) else tasks
        for problem in problems:
            print(f"BAD TASK {' '.join(problem.split())}", file=out)
        if cfg.env.sandbox is None or cfg.env.sandbox.task_images != "build":
            raise DockyardError("env.sandbox.task_images is host (nothing to build); set it to build")   # a setting: exit 2
        env = cls(cfg.env)
        env.environments.rebuild = rebuild
        started, built, failed = time.monotonic(), 0, 0
        try:
            for number, task in enumerate(tasks, 1):
                try:
                    row = env.environments.environment_for(task)
                except (SweTaskError, SandboxError) as err:
                    failed += 1
                    print(f"[{number}/{len(tasks)}] {task.instance_id}: failed: {' '.join(str(err).split())[:300]}",
                          file=out, flush=True)
                    continue
                built += row.image.built_now
                print(f"[{number}/{len(tasks)}] {task.instance_id}: {'; '.join(row.notes)}", file=out, flush=True)
        finally:
            env.repos.close()
        print(f"{len(tasks)} rows: {built} built, {len(tasks) - built - failed} cached, {failed} failed, in "
              f"{time.monotonic() - started:.1f} s (cache: {env.sandboxes.images.cache_dir})", file=out)
        return 1 if failed or problems else 0


class SweEpisode(ShellEpisode):
    """The agentic way: the repository at base_commit in a sandbox, the agent's shell in it; at the end
    the diff of its work tree against base_commit is the patch, scored like a single-shot one (in a
    fresh sandbox, with the integrity check)."""

    def __init__(self, env: SweEnvironment, task: SweTask):
        self.env, self.task = env, task
        spec, _ = row_sandbox(task, env.repos, env.environments)
        sandbox = env.sandboxes.create(spec)
        super().__init__(sandbox, env.config.task_timeout_s, env.max_output_chars, f"task {task.instance_id}")
        if task.setup_command.strip():
            setup = sandbox.run(task.setup_command)
            if not setup.ok:
                sandbox.destroy()
                raise SweTaskError(f"{task.where}: before_repo_set_cmd failed ({_status(setup)})")
        # where the agent starts: base_commit, or the harness's set-up commit on a built environment
        start = sandbox.run("git rev-parse HEAD")
        if not start.ok:
            sandbox.destroy()
            raise SweTaskError(f"{task.where}: the repository in the sandbox has no HEAD: {start.output.strip()[-200:]}")
        self.start = start.output.strip().splitlines()[-1]
        # the repository's own git configuration before the agent runs: its diff, textconv and filter
        # drivers run commands, so the verifier takes the patch under this copy, not the agent's
        config = sandbox.run("cat .git/config")
        self.git_config = config.output if config.ok else ""

    def patch(self) -> str:
        """The agent's changes as a diff against base_commit (new files included; caches left out), taken
        by the verifier once the agent's processes are gone (git hooks and fsmonitor off)."""
        self.sandbox.hand_over()
        env, _ = verifier_env(self.sandbox, {}, [], safe_path=True, plugin_autoload=False, plugin=None)
        saved = f"{self.task.repo_dir}/.git/dockyard-agent.patch"
        with tempfile.TemporaryDirectory() as folder:
            Path(folder, "config").write_text(self.git_config)
            self.sandbox.copy_in(Path(folder), "/dockyard-git", read_only=True)
        result = self.sandbox.run("cp /dockyard-git/config .git/config && rm -f .git/info/attributes && "
                                  "rm -rf .pytest_cache; find . -name __pycache__ -type d -prune -exec rm -rf {} +; "
                                  "git add -A && git diff --cached --no-color --no-ext-diff --no-textconv "
                                  f"{self.start} > {saved}", env={**env, "HOME": self.task.repo_dir}, replace_env=True)
        if not result.ok:
            return ""
        with tempfile.TemporaryDirectory() as folder:
            self.sandbox.copy_out(saved, Path(folder) / "agent.patch")
            return (Path(folder) / "agent.patch").read_text(errors="replace")

    def finish(self) -> float:
        patch = self.patch()
        self.suspicious = shadowing_paths(patch)
        result = self.env.judge(self.task, patch)
        if result.flagged and self.env.integrity_check:
            print(f"swe: {self.task.instance_id}: integrity check: the agent edited {', '.join(result.flagged)}; "
                  "scored 0", file=sys.stderr, flush=True)
        self.events.append({"patch": patch[-4000:], "tests": result.log[-4000:], "flagged": result.flagged,
                            "reward": result.reward})
        return result.reward
