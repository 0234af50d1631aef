"""`program_bench`: program synthesis graded by hidden tests run in a sandbox.

The reply's program is its last ```python block (an unclosed one counts: the configs stop generation
at the closing fence), else the whole reply. The tests are the row's label (label_key), in one of the
published forms:
  - stdin/stdout, APPS / TACO: {"inputs": [...], "outputs": [...]} (a dict or its JSON text); each input
    is fed to `python3 solution.py` and the output compared line by line, trailing spaces ignored;
  - function calls, APPS / TACO with "fn_name": each input is the argument list of one call of that
    function, the output its expected return value (compared after a JSON round trip);
  - a list of {"input": ..., "output": ...} cases (LiveCodeBench's test cases, testtype stdin);
  - HumanEval (the row has `entry_point`): the label is the test code defining check(candidate); the
    program is the prompt, the reply's code and the tests, ending in check(entry_point).
Each test is one fresh process in the completion's sandbox, with the time limit
env.sandbox.command_exec_timeout_s and the sandbox's memory cap (env.sandbox.memory_mb).

Reward: env.reward_mode `fraction` (the share of the tests that pass: partial credit) or `all_pass`
(1 only when every test passes). env.tests_per_problem uses the first N tests of a problem (null: all).
env.language: python (the only one built; another is refused by name).
A row whose tests cannot be read is a failed trajectory with the file and the problem named; the run
goes on with the rest.
"""

from __future__ import annotations

import json
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

from dockyard.config.schema.env import EnvConfig, SandboxConfig
from dockyard.data.datasets import Prompt
from dockyard.errors import DockyardError
from dockyard.sandboxes.factory import SandboxFactory
from dockyard.sandboxes.base import SandboxError, SandboxSpec

REWARD_MODES = ("fraction", "all_pass")
WORKDIR = "/solution"
_BLOCKS = re.compile(r"```(?:python|py|python3)?[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL)


class ProblemFormatError(DockyardError, ValueError):
    """A problem whose tests cannot be read; the message names the file and the problem."""


def extract_program(completion: str) -> str:
    blocks = _BLOCKS.findall(completion)
    # leading spaces stay: a HumanEval reply may be the indented body of the prompt's function
    return (blocks[-1] if blocks else completion).strip("\n").rstrip() + "\n"


@dataclass
class Case:
    input: object          # stdin text, or the argument list of a call
    output: object


@dataclass
class Problem:
    name: str
    cases: list[Case]
    fn_name: str | None = None      # function-call tests
    humaneval: tuple[str, str, str] | None = None   # (prompt, test code, entry point)


def _where(prompt: Prompt) -> str:
    row = prompt.metadata
    name = row.get("task_id") or row.get("problem_id") or row.get("question_id") or row.get("id")
    return f"{prompt.source_file or prompt.source}: problem {name}" if name is not None else \
        f"{prompt.source_file or prompt.source}: a problem"


def read_problem(prompt: Prompt, limit: int | None) -> Problem:
    where, tests, row = _where(prompt), prompt.label, prompt.metadata
    if row.get("entry_point"):
        if not isinstance(tests, str) or "def check" not in tests:
            raise ProblemFormatError(f"{where}: a HumanEval row's label must be its test code (def check(candidate))")
        return Problem(where, [Case(None, None)], humaneval=(str(row.get("prompt", prompt.input)), tests,
                                                           str(row["entry_point"])))
    if isinstance(tests, str):
        try:
            tests = json.loads(tests)
        except json.JSONDecodeError as err:
            raise ProblemFormatError(f"{where}: its tests are not JSON ({err.msg})") from None
    if isinstance(tests, dict) and "inputs" in tests and "outputs" in tests:
        inputs, outputs = tests["inputs"], tests["outputs"]
        if not isinstance(inputs, list) or not isinstance(outputs, list) or len(inputs) != len(outputs):
            raise ProblemFormatError(f"{where}: tests need as many outputs as inputs (lists)")
        cases, fn_name = [Case(i, o) for i, o in zip(inputs, outputs)], tests.get("fn_name")
    elif isinstance(tests, list) and all(isinstance(t, dict) and "input" in t and "output" in t for t in tests):
        cases, fn_name = [Case(t["input"], t["output"]) for t in tests], None
    else:
        raise ProblemFormatError(f"{where}: no tests: expected {{inputs, outputs[, fn_name]}} or a list of "
                                 "{input, output} cases (label_key), or a HumanEval row")
    if not cases:
        raise ProblemFormatError(f"{where}: its test list is empty")
    return Problem(where, cases[:limit] if limit else cases, fn_name)


# Runs one function-call test: the solution module's function on the case's arguments, its return
# value printed as JSON on the last line.
CALL = """import json, sys
sys.path.insert(0, {workdir!r})
import solution
args = json.load(open(sys.argv[1]))
result = getattr(solution, sys.argv[2])(*args)
print(json.dumps(result))
"""


def _same_stdout(got: str, want: object) -> bool:
    want_text = "\n".join(want) if isinstance(want, list) else str(want)
    clean = lambda text: [line.rstrip() for line in text.strip().splitlines()]   # noqa: E731
    return clean(got) == clean(want_text)


def _same_value(got: str, want: object) -> bool:
    lines = got.strip().splitlines()
    if not lines:
        return False
    try:
        value = json.loads(lines[-1])
    except json.JSONDecodeError:
        return False
    expected = json.loads(json.dumps(want))
    if isinstance(expected, list) and len(expected) == 1 and value != expected:
        expected = expected[0]   # APPS wraps a function's expected return value in a list
    return value == expected


class ProgramBenchEnvironment:
    EXTRA_KEYS = frozenset({"language", "tests_per_problem", "reward_mode"})

    @classmethod
    def check_settings(cls, config: EnvConfig) -> dict:
        """The env settings, checked (ValueError naming the field); the preflight calls it too."""
        extra = dict(config.model_extra or {})
        unknown = sorted(set(extra) - cls.EXTRA_KEYS)
        if unknown:
            raise ValueError(f"env.{unknown[0]}: not a program_bench setting (known: {', '.join(sorted(cls.EXTRA_KEYS))})")
        if extra.get("language", "python") != "python":
            raise ValueError(f"env.language: {extra['language']!r} is not built; program_bench runs python")
        limit = extra.get("tests_per_problem")
        if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 1):
            raise ValueError(f"env.tests_per_problem: must be a positive whole number or null, got {limit!r}")
        if extra.get("reward_mode", "fraction") not in REWARD_MODES:
            raise ValueError(f"env.reward_mode: {extra['reward_mode']!r} is not one of {', '.join(REWARD_MODES)}")
        if config.reward is not None:
            raise ValueError("env.reward: program_bench is scored by its tests; set env.reward to null")
        return extra

    def __init__(self, config: EnvConfig):
        extra = self.check_settings(config)
        self.reward_mode = extra.get("reward_mode", "fraction")
        self.limit = extra.get("tests_per_problem")
        self.sandboxes = SandboxFactory(config.sandbox or SandboxConfig())

    def score(self, completion: str, prompt: Prompt) -> float:
        passed, total, _ = self.run_tests(read_problem(prompt, self.limit), extract_program(completion))
        if self.reward_mode == "all_pass":
            return 1.0 if passed == total else 0.0
        return passed / total

    def action_valid(self, completion: str) -> bool:
        """The action is the program: invalid when the reply holds no code block."""
        return bool(_BLOCKS.search(completion))

    def run_tests(self, problem: Problem, program: str) -> tuple[int, int, list[str]]:
        """(tests passed, tests run, one line per test)."""
        timeout = self.sandboxes.limits.command_timeout_s
        notes: list[str] = []
        passed = 0
        with tempfile.TemporaryDirectory() as scratch:
            folder = Path(scratch)
            if problem.humaneval:
                prompt, test, entry = problem.humaneval
                (folder / "solution.py").write_text(f"{prompt}\n{program}\n\n{test}\n\ncheck({entry})\n")
            else:
                (folder / "solution.py").write_text(program)
                (folder / "call.py").write_text(CALL.format(workdir=WORKDIR))
            for index, case in enumerate(problem.cases):
                if problem.fn_name:
                    (folder / f"args_{index}.json").write_text(json.dumps(case.input))
                elif not problem.humaneval:
                    text = "\n".join(case.input) if isinstance(case.input, list) else str(case.input)
                    (folder / f"in_{index}.txt").write_text(text)
            with self.sandboxes.create(SandboxSpec(workdir="/workspace", name=problem.name)) as sandbox:
                sandbox.copy_in(folder, WORKDIR, read_only=True)
                for index, case in enumerate(problem.cases):
                    if problem.humaneval:
                        command = f"python3 {WORKDIR}/solution.py"
                    elif problem.fn_name:
                        command = f"python3 {WORKDIR}/call.py {WORKDIR}/args_{index}.json {problem.fn_name}"
                    else:
                        command = f"python3 {WORKDIR}/solution.py < {WORKDIR}/in_{index}.txt"
                    result = sandbox.run(command, timeout_s=timeout)
                    if result.timed_out:
                        ok, why = False, f"timed out after {timeout:g} s"
                    elif result.exit_code != 0:
                        ok, why = False, f"exit status {result.exit_code}: {result.output.strip()[-200:]}"
                    elif problem.humaneval:
                        ok, why = True, ""
                    elif problem.fn_name:
                        ok = _same_value(result.output, case.output)
                        why = "" if ok else f"returned {result.output.strip()[-100:]!r}"
                    else:
                        ok = _same_stdout(result.output, case.output)
                        why = "" if ok else f"printed {result.output.strip()[-100:]!r}"
                    passed += ok
                    notes.append(f"test {index}: {'pass' if ok else 'FAIL ' + why}")
        return passed, len(problem.cases), notes

    def reference_reply(self, prompt: Prompt) -> str | None:
        """The oracle's reply for `dockyard env check`: the row's reference solution (APPS `solutions`,
        HumanEval `canonical_solution`, or `solution`)."""
        row = prompt.metadata
        if row.get("canonical_solution"):
            return "```python\n" + str(row["canonical_solution"]) + "\n```"
        solutions = row.get("solutions", row.get("solution"))
        if isinstance(solutions, str) and solutions.strip().startswith("["):
            solutions = json.loads(solutions)
        if isinstance(solutions, list):
            solutions = solutions[0] if solutions else None
        return f"```python\n{solutions}\n```" if solutions else None

    @classmethod
    def reference_trials(cls, cfg, source, agent: str):
        """`dockyard env check`: the reference solution (oracle) or an empty program (noop) against
        every problem's tests; problems whose tests or solution cannot be read are reported apart."""
        from concurrent.futures import ThreadPoolExecutor

        from dockyard.envs.check import source_prompts
        from dockyard.envs.terminal_trial import TrialResult

        env = cls(cfg.env)
        problems: list[str] = []

        def trial(prompt: Prompt) -> TrialResult | None:
            try:
                problem = read_problem(prompt, env.limit)
                reply = env.reference_reply(prompt) if agent == "oracle" else ""
                if reply is None:
                    raise ProblemFormatError(f"{problem.name}: no reference solution for the oracle")
                passed, total, notes = env.run_tests(problem, extract_program(reply) if reply else "")
            except (ProblemFormatError, SandboxError) as err:
                problems.append(str(err))
                return None
            reward = passed / total if env.reward_mode == "fraction" else float(passed == total)
            name = problem.name.rsplit(": problem ", 1)[-1]
            return TrialResult(name, reward, 0.0, test_output="\n".join(notes))

        with ThreadPoolExecutor(max_workers=cfg.env.num_workers) as pool:
            results = [r for r in pool.map(trial, source_prompts(cfg, source)) if r is not None]
        return results, problems
