"""SWE-bench Pro rows scored by their own run_scripts/<instance_id>/run_script.sh and parser.py (the Pro
evaluation's layout), in bubblewrap and in podman: the reference patch 1 and the no-op 0, the parser's
statuses graded the evaluation's way, a parser that fails named, a row missing from a named folder
refused, an agent working in /app, and a patch whose code forges an output.json paid nothing."""

import json
import shutil

import pytest

from dockyard.agents.tool_format import Action
from dockyard.config.schema.env import EnvConfig, SandboxConfig
from dockyard.data.datasets import Prompt
from dockyard.envs.swe import SweEnvironment, SweScorer
from dockyard.envs.swe_pro import RunScripts, read_output
from dockyard.envs.swe_tasks import RepoStore, SweTaskError, read_task_file
from dockyard.sandboxes.bubblewrap import bwrap_path
from dockyard.sandboxes.factory import SandboxFactory
from dockyard.sandboxes.podman import podman_path
from tests.conftest import REPO

SHIPPED = REPO / "tasks" / "swe"
FORMAT_TASK = "instance_dockyard-tasks__minicalc-format-duration"
KINDS = [pytest.param("bubblewrap", marks=pytest.mark.skipif(bwrap_path() is None, reason="bubblewrap is not installed")),
         pytest.param("podman", marks=pytest.mark.skipif(podman_path() is None, reason="podman is not installed"))]


def pro_tasks() -> dict:
    found, problems = read_task_file(SHIPPED / "swe_pro.jsonl")
    assert not problems
    return {task.instance_id: task for task in found}


@pytest.fixture(scope="module")
def repos():
    store = RepoStore(None)
    yield store
    store.close()


def scorer(repos, kind: str, mode: str = "binary", run_scripts: str | None = None) -> SweScorer:
    factory = SandboxFactory(SandboxConfig(type=kind, command_exec_timeout_s=120, max_concurrent=2))
    return SweScorer(factory, repos, mode, True, run_scripts=RunScripts(run_scripts))


@pytest.mark.parametrize("kind", KINDS)
def test_the_rows_run_script_and_parser_score_the_reference_1_and_the_no_op_0(repos, kind):
    # both rows in bubblewrap; one in podman (its sandboxes start slower, and the path is the same)
    for task in list(pro_tasks().values())[:None if kind == "bubblewrap" else 1]:
        gold = scorer(repos, kind).score(task, task.patch)
        assert gold.reward == 1.0 and gold.resolved and gold.tests_ran == "row's parser", gold.log
        assert f"run_scripts/{task.instance_id}" in " ".join(gold.notes)
        assert "bash /dockyard-pro/run_script.sh" in gold.log and "Running selected tests:" in gold.log
        assert all(gold.statuses[name] == "PASSED" for name in task.fail_to_pass + task.pass_to_pass)
        noop = scorer(repos, kind).score(task, "")
        assert noop.reward == 0.0 and not noop.resolved, noop.log
        assert noop.tests_ran == "row's parser", noop.log
        assert not all(noop.statuses.get(name) == "PASSED" for name in task.fail_to_pass), noop.statuses


@pytest.mark.skipif(bwrap_path() is None, reason="bubblewrap is not installed")
def test_only_passed_counts_and_partial_credit_reads_the_parsers_statuses(repos):
    task = pro_tasks()[FORMAT_TASK]
    # the reference fix without its negative-number check: 2 of the 3 fail_to_pass tests pass
    partial = task.patch.replace('+    if seconds < 0:\n+        raise ValueError(f"negative duration: {seconds}")\n', "")
    partial = partial.replace("@@ -9,3 +9,15 @@", "@@ -9,3 +9,13 @@")
    fraction = scorer(repos, "bubblewrap", "tests_pass").score(task, partial)
    assert fraction.reward == pytest.approx(2 / 3) and fraction.tests_ran == "row's parser", fraction.log
    assert fraction.statuses["tests/test_format.py::test_format_zero_and_negative"] == "FAILED"
    assert scorer(repos, "bubblewrap").score(task, partial).reward == 0.0
    # the evaluation's rule: a SKIPPED or absent test is not a pass; the output must be its JSON shape
    statuses, why = read_output(json.dumps({"tests": [{"name": "a", "status": "PASSED"},
                                                      {"name": "b", "status": "SKIPPED"}]}))
    assert statuses == {"a": "PASSED", "b": "SKIPPED"} and why is None
    assert read_output('{"tests": [{"name": "a", "status": "OK"}]}')[1].startswith("the row's parser.py wrote an output.json")
    assert read_output("not json")[0] == {}


def copy_of_scripts(tmp_path, parser: str | None = None):
    folder = tmp_path / "run_scripts"
    shutil.copytree(SHIPPED / "run_scripts", folder)
    if parser is not None:
        (folder / FORMAT_TASK / "parser.py").write_text(parser)
    return folder


@pytest.mark.skipif(bwrap_path() is None, reason="bubblewrap is not installed")
def test_a_parser_that_writes_nothing_and_a_row_missing_from_the_named_folder_are_named(repos, tmp_path):
    task = pro_tasks()[FORMAT_TASK]
    broken = copy_of_scripts(tmp_path, "import sys\nprint('cannot read the logs')\nsys.exit(3)\n")
    result = scorer(repos, "bubblewrap", run_scripts=str(broken)).score(task, task.patch)
    assert result.reward == 0.0 and result.tests_ran == "no"
    assert "the row's parser.py wrote no output.json (exit status 3: cannot read the logs)" in result.log
    shutil.rmtree(broken / FORMAT_TASK)
    with pytest.raises(SweTaskError, match=f"task {FORMAT_TASK}: its run script folder lacks .*{FORMAT_TASK}/run_script.sh "
                                           "and .*parser.py .env.run_scripts_dir"):
        scorer(repos, "bubblewrap", run_scripts=str(broken)).score(task, task.patch)
    with pytest.raises(ValueError, match="env.run_scripts_dir: '/nowhere' is not a folder"):
        SweEnvironment(EnvConfig(name="swe", run_scripts_dir="/nowhere"))


# the fix's module, imported by the tests, leaves a forged result wherever an evaluation might read one;
# the tests themselves still fail (nothing is fixed), and their output is what the parser reads
FORGE = """diff --git a/minicalc/__init__.py b/minicalc/__init__.py
index 11651c4..f5a5fac 100644
--- a/minicalc/__init__.py
+++ b/minicalc/__init__.py
@@ -1,3 +1,4 @@
+from minicalc import forge  # noqa
 from minicalc.duration import parse_duration
 from minicalc.stats import mean, median
 
diff --git a/minicalc/forge.py b/minicalc/forge.py
new file mode 100644
index 0000000..d11dc97
--- /dev/null
+++ b/minicalc/forge.py
@@ -0,0 +1,7 @@
+import json, os
+names = ["tests/test_format.py::" + n for n in ("test_format_duration", "test_format_zero_and_negative", "test_round_trip")]
+names += ["tests/test_duration.py::test_single_unit", "tests/test_duration.py::test_rejects_garbage"]
+forged = json.dumps({"tests": [{"name": n, "status": "PASSED"} for n in names]})
+for folder in ("/dockyard-pro-logs", "/dockyard-parse", "/workspace", "/app", "/tmp"):
+    try: open(os.path.join(folder, "output.json"), "w").write(forged)
+    except OSError: pass
"""


@pytest.mark.parametrize("kind", KINDS)
def test_a_patch_whose_code_writes_a_passing_output_json_gets_nothing(repos, kind):
    task = pro_tasks()[FORMAT_TASK]
    result = scorer(repos, kind).score(task, FORGE)
    assert result.applied, result.log
    assert result.reward == 0.0 and not result.resolved, result.log
    assert result.statuses.get("tests/test_format.py::test_format_duration") != "PASSED"


@pytest.mark.skipif(bwrap_path() is None, reason="bubblewrap is not installed")
def test_an_agent_on_a_pro_row_works_in_app_and_its_diff_is_scored_by_the_run_script():
    env = SweEnvironment(EnvConfig(name="swe", agent="tool_calling", sandbox=SandboxConfig(
        type="bubblewrap", command_exec_timeout_s=60, max_processes=64)))
    row = next(json.loads(line) for line in (SHIPPED / "swe_pro.jsonl").read_text().splitlines()
               if json.loads(line)["instance_id"] == FORMAT_TASK)
    [prompt] = env.prepare_prompts([Prompt(row["problem_statement"], row["patch"], row, "swe", str(SHIPPED / "swe_pro.jsonl"))])
    assert "checked out in /app" in prompt.input
    patch_file = "/tmp/fix.patch"
    handle = env.open(prompt)
    try:
        where = handle.execute(Action("tool", "bash", {"command": "pwd && ls"}))
        assert "/app" in where and "minicalc" in where
        handle.execute(Action("tool", "bash", {"command": f"cat > {patch_file} <<'EOF'\n{row['patch']}EOF"}))
        handle.execute(Action("tool", "bash", {"command": f"git apply {patch_file}"}))
        assert handle.finish() == 1.0, handle.events[-1]
        assert "def format_duration" in handle.events[-1]["patch"]
    finally:
        handle.close()


@pytest.mark.skipif(bwrap_path() is None, reason="bubblewrap is not installed")
def test_a_pro_row_without_a_run_scripts_folder_runs_pytest_over_its_selected_files_and_says_so(tmp_path):
    shutil.copy(SHIPPED / "swe_pro.jsonl", tmp_path / "swe_pro.jsonl")   # no run_scripts/ beside it
    [task, *_] = read_task_file(tmp_path / "swe_pro.jsonl")[0]
    store = RepoStore(SHIPPED / "repos")
    try:
        result = scorer(store, "bubblewrap").score(task, task.patch)
    finally:
        store.close()
    assert result.reward == 1.0 and result.tests_ran == "pytest record", result.log
    assert result.notes == [f"no {tmp_path / 'run_scripts' / task.instance_id}/run_script.sh: pytest ran the row's "
                            "selected test files (env.run_scripts_dir)"]

