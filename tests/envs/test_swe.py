"""SWE tasks: both published row formats, patch extraction, scoring in real bubblewrap sandboxes
(reward modes, patches that do not apply, the integrity check), `dockyard env check` on the shipped
sets, and bad rows reported per task while the rest are checked."""

import io
import json
import shutil
import subprocess
import sys

import pytest

from dockyard.config import load_config
from dockyard.config.schema.env import SandboxConfig
from dockyard.envs.check import check
from dockyard.envs.swe import SweScorer, edited_tests, extract_patch, command_for
from dockyard.envs.swe_tasks import RepoStore, SweTaskError, read_task_file, task_from_row
from dockyard.sandboxes.bubblewrap import bwrap_path
from dockyard.sandboxes.factory import SandboxFactory
from tests.conftest import REPO

SHIPPED = REPO / "tasks" / "swe"
needs_bwrap = pytest.mark.skipif(bwrap_path() is None, reason="bubblewrap is not installed (tools/install.sh)")

# conftest.py at the repository root that turns every test's result into a pass: what a reward hacker
# would submit. The test files are reset before the tests run; this file is not a test file of the task.
CHEAT = """diff --git a/conftest.py b/conftest.py
new file mode 100644
--- /dev/null
+++ b/conftest.py
@@ -0,0 +1,7 @@
+import pytest
+
+@pytest.hookimpl(hookwrapper=True)
+def pytest_runtest_makereport(item, call):
+    outcome = yield
+    report = outcome.get_result()
+    report.outcome = "passed"
"""


def tasks(name: str = "swe_bench.jsonl") -> dict:
    found, problems = read_task_file(SHIPPED / name)
    assert not problems
    return {task.instance_id: task for task in found}


@pytest.fixture(scope="module")
def repos():
    store = RepoStore(None)
    yield store
    store.close()


def scorer(repos, mode: str = "binary", integrity: bool = True) -> SweScorer:
    factory = SandboxFactory(SandboxConfig(type="bubblewrap", command_exec_timeout_s=60, max_concurrent=4))
    return SweScorer(factory, repos, mode, integrity)


def test_both_published_formats_load_from_the_shipped_sets():
    bench = tasks()
    assert len(bench) == 6
    slug = bench["dockyard-tasks__textkit-slugify-collapse"]
    assert slug.repo == "dockyard-tasks/textkit" and len(slug.base_commit) == 40
    assert slug.fail_to_pass == ["tests/test_slug.py::test_slugify_collapses_separators"]
    assert slug.pass_to_pass == ["tests/test_slug.py::test_slugify_lowercases"]
    assert slug.test_files == ["tests/test_slug.py"] and slug.setup_command == ""
    assert slug.own_test_command == "" and command_for(slug, built=False) == \
        "python3 -m pytest -rA -p no:cacheprovider tests/test_slug.py"   # the harness knows no such repository
    pro = tasks("swe_pro.jsonl")["instance_dockyard-tasks__minicalc-format-duration"]
    assert pro.test_files == ["tests/test_format.py", "tests/test_duration.py"]   # selected_test_files_to_run
    assert len(pro.fail_to_pass) == 3 and pro.setup_command.startswith("git reset --hard")
    rows = [json.loads(line) for line in (SHIPPED / "swe_bench.jsonl").read_text().splitlines()]
    assert all(isinstance(row["FAIL_TO_PASS"], str) for row in rows)    # JSON-encoded, as SWE-bench ships them


def test_a_patch_is_found_in_tags_fences_or_bare_and_missing_otherwise():
    diff = "--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n-a\n+b\n"
    assert extract_patch(f"Here it is:\n<patch>\n{diff}</patch>\nDone.") == diff
    assert extract_patch(f"```diff\n{diff}```\nThat fixes it.") == diff
    assert extract_patch(f"The fix:\ndiff --git a/x.py b/x.py\n{diff}") == f"diff --git a/x.py b/x.py\n{diff}"
    assert extract_patch("I would change slugify to collapse dashes.") is None
    assert extract_patch("```python\nprint(1)\n```") is None


def test_the_integrity_check_names_the_test_files_a_patch_touches():
    slug = tasks()["dockyard-tasks__textkit-slugify-collapse"]
    assert edited_tests(slug, slug.patch) == []
    assert edited_tests(slug, slug.test_patch) == ["tests/test_slug.py"]
    assert edited_tests(slug, CHEAT) == ["conftest.py"]
    assert edited_tests(slug, "--- a/src/app_test.py\n+++ b/src/app_test.py\n") == ["src/app_test.py"]


def diff_of(repos, task, work, *edits: tuple[str, str, str]) -> str:
    """The patch (git diff) that makes each edit (path, old text, new text) to the task's checkout."""
    shutil.copytree(repos.checkout(task), work)
    for path, old, new in edits:
        text = (work / path).read_text()
        assert old in text
        (work / path).write_text(text.replace(old, new))
    return subprocess.run(["git", "-C", str(work), "diff"], capture_output=True, text=True, check=True).stdout


@needs_bwrap
def test_reward_modes_partial_fixes_and_broken_tests(repos, tmp_path):
    pro = tasks("swe_pro.jsonl")["instance_dockyard-tasks__minicalc-format-duration"]
    # the reference fix without its negative-number check: 2 of the 3 FAIL_TO_PASS tests pass
    partial = pro.patch.replace('+    if seconds < 0:\n+        raise ValueError(f"negative duration: {seconds}")\n', "")
    partial = partial.replace("@@ -9,3 +9,15 @@", "@@ -9,3 +9,13 @@")
    fraction = scorer(repos, "tests_pass").score(pro, partial)
    assert fraction.applied and fraction.reward == pytest.approx(2 / 3), fraction.log
    assert fraction.statuses["tests/test_format.py::test_format_zero_and_negative"] == "FAILED"
    assert scorer(repos, "binary").score(pro, partial).reward == 0.0
    assert scorer(repos, "binary").score(pro, pro.patch).reward == 1.0
    # the fix of mean([]) that also breaks median (a PASS_TO_PASS test): 0 in both modes
    mean_task = tasks()["dockyard-tasks__minicalc-mean-empty"]
    fix = ("minicalc/stats.py", "    return sum(values) / len(values)\n",
           "    if not values:\n        raise ValueError(\"mean of no values\")\n    return sum(values) / len(values)\n")
    fixed = scorer(repos, "tests_pass").score(mean_task, diff_of(repos, mean_task, tmp_path / "a", fix))
    assert fixed.reward == 1.0, fixed.log
    both = diff_of(repos, mean_task, tmp_path / "b", fix, ("minicalc/stats.py", "ordered[len(ordered) // 2]", "ordered[0]"))
    broken = scorer(repos, "tests_pass").score(mean_task, both)
    assert broken.statuses["tests/test_stats.py::test_mean_of_nothing_raises"] == "PASSED"
    assert broken.statuses["tests/test_stats.py::test_median_odd"] == "FAILED" and broken.reward == 0.0
    garbage = scorer(repos).score(mean_task, "--- a/minicalc/nothere.py\n+++ b/minicalc/nothere.py\n@@ -1 +1 @@\n-x\n+y\n")
    assert garbage.reward == 0.0 and not garbage.applied and "does not apply" in garbage.log


@needs_bwrap
def test_the_integrity_check_stops_a_patch_that_rewrites_test_results(repos):
    slug = tasks()["dockyard-tasks__textkit-slugify-collapse"]
    unchecked = scorer(repos, integrity=False).score(slug, CHEAT)
    # without the integrity check the conftest.py runs and pytest's summary says every test passed; the
    # grade comes from pytest's record, which names the plugin the patch added, and pays nothing
    assert "FAILED" not in unchecked.log and "PASSED tests/test_slug.py" in unchecked.log, unchecked.log
    assert unchecked.reward == 0.0 and "/testbed/conftest.py" in unchecked.flagged, unchecked.log
    checked = scorer(repos).score(slug, CHEAT)
    assert checked.reward == 0.0 and checked.flagged == ["conftest.py"] and not checked.applied
    # editing the task's own test file does not help either way: the test files are reset first
    weakened = slug.test_patch.replace('+    assert slugify("Hello, World!") == "hello-world"\n', "")
    assert scorer(repos, integrity=False).score(slug, weakened).reward == 0.0


@needs_bwrap
def test_env_check_solves_every_shipped_task_with_the_oracle_and_none_without_work():
    result = subprocess.run([sys.executable, "-m", "dockyard.cli", "env", "check", "--config", "grpo_swe_local.yaml",
                             "--agent", "oracle"], capture_output=True, text=True, timeout=600, cwd=REPO)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "mean reward 1.00 over 6 tasks" in result.stdout and "sandbox bubblewrap" in result.stdout
    cfg = load_config("grpo_swe_local.yaml", ["models_dir=models"]).config
    for name, count in (("swe_bench.jsonl", 6), ("swe_pro.jsonl", 2)):
        for agent, mean in (("oracle", "1.00"), ("noop", "0.00")):
            if (name, agent) == ("swe_bench.jsonl", "oracle"):
                continue
            out = io.StringIO()
            assert check(cfg, str(SHIPPED / name), agent, out) == 0, out.getvalue()
            assert f"mean reward {mean} over {count} tasks" in out.getvalue()


@needs_bwrap
def test_bad_rows_are_named_per_task_and_the_rest_are_checked(tmp_path):
    rows = [json.loads(line) for line in (SHIPPED / "swe_bench.jsonl").read_text().splitlines()]
    good = rows[0]
    no_tests = {**rows[1], "FAIL_TO_PASS": "[]"}
    unknown_repo = {**rows[2], "repo": "someone/elsewhere"}
    bad_commit = {**rows[3], "base_commit": "0" * 40}
    broken_test_patch = {**rows[4], "test_patch": "--- a/tests/test_stats.py\n+++ b/tests/test_stats.py\n@@ -99 +99 @@\n-x\n+y\n"}
    lines = [json.dumps(good), "{not json", json.dumps(no_tests), json.dumps({k: v for k, v in rows[5].items() if k != "PASS_TO_PASS"}),
             json.dumps(unknown_repo), json.dumps(bad_commit), json.dumps(broken_test_patch)]
    file = tmp_path / "mixed.jsonl"
    file.write_text("\n".join(lines) + "\n")
    (tmp_path / "repos").symlink_to(SHIPPED / "repos")
    cfg = load_config("grpo_swe_local.yaml", ["models_dir=models"]).config
    out = io.StringIO()
    assert check(cfg, str(file), "oracle", out) == 1
    report = out.getvalue()
    assert f"BAD TASK {file}:2: not JSON" in report
    assert f"BAD TASK {file}:3: task {rows[1]['instance_id']}: FAIL_TO_PASS is empty" in report
    assert f"BAD TASK {file}:4: task {rows[5]['instance_id']}: no PASS_TO_PASS / pass_to_pass column" in report
    assert "repository someone/elsewhere not found" in report
    assert f"cannot check out {'0' * 40}" in report
    assert "its test_patch does not apply" in report
    assert f"{good['instance_id']}  " in report and "BROKEN " + good["instance_id"] not in report
    assert "Traceback" not in report


def test_a_row_is_refused_by_column():
    row = json.loads((SHIPPED / "swe_bench.jsonl").read_text().splitlines()[0])
    with pytest.raises(SweTaskError, match=r"f.jsonl:7: task .*: FAIL_TO_PASS is not a JSON \(or Python\) list"):
        task_from_row({**row, "FAIL_TO_PASS": "[tests"}, "f.jsonl", 7)
    with pytest.raises(SweTaskError, match="no base_commit"):
        task_from_row({k: v for k, v in row.items() if k != "base_commit"}, "f.jsonl", 1)


@pytest.fixture(scope="module")
def secret_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("secret") / "scoring.secret"
    path.write_text("0123456789abcdef0123456789abcdef\n")
    path.chmod(0o600)
    return path


@pytest.fixture(scope="module")
def scoring_server(tmp_path_factory, secret_file):
    """A real `dockyard env serve-swe` process (bubblewrap sandboxes) on a free port, scoring the tasks of
    grpo_swe_local's dataset (the shipped SWE-bench rows); yields its URL."""
    import os
    import time

    folder = tmp_path_factory.mktemp("swe-server")
    address = folder / "address.json"
    log = open(folder / "server.log", "w")
    process = subprocess.Popen([sys.executable, "-m", "dockyard.cli", "env", "serve-swe", "--config", "grpo_swe_local.yaml",
                                "--host", "127.0.0.1", "--port", "0", "--address-file", str(address), "models_dir=models",
                                f"+env.scoring_secret_file={secret_file}",
                                f"data.datasets=[{{name: a, path: {SHIPPED / 'swe_bench.jsonl'}, metadata_key: null}}, "
                                f"{{name: b, path: {SHIPPED / 'swe_pro.jsonl'}, metadata_key: null}}]"],
                               cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ, PYTHONPATH=str(REPO)))
    deadline = time.monotonic() + 120
    while not address.exists():
        assert process.poll() is None and time.monotonic() < deadline, (folder / "server.log").read_text()
        time.sleep(0.2)
    yield f"http://127.0.0.1:{json.loads(address.read_text())['port']}"
    process.terminate()
    process.wait(timeout=30)
    log.close()


@needs_bwrap
def test_a_scoring_server_needs_the_runs_secret_and_scores_only_its_own_tasks(scoring_server, secret_file, tmp_path):
    import httpx

    request = {"instance_id": "dockyard-tasks__textkit-slugify-collapse", "patch": ""}
    assert httpx.post(f"{scoring_server}/score", json=request, timeout=60).status_code == 401
    wrong = {"Authorization": "Bearer " + "f" * 32}
    assert httpx.post(f"{scoring_server}/score", json=request, headers=wrong, timeout=60).status_code == 401
    right = {"Authorization": f"Bearer {secret_file.read_text().strip()}"}
    # what a client once could send: a row of its own, a task file and a repos folder to read
    forged = {**request, "instance_id": "not-a-task-of-this-server", "row": {"test_cmd": "touch /tmp/owned"},
              "task_file": "/etc/passwd", "repos_dir": "/root"}
    answer = httpx.post(f"{scoring_server}/score", json=forged, headers=right, timeout=60)
    assert answer.status_code == 404 and "not one of this server's" in answer.json()["detail"]
    assert httpx.post(f"{scoring_server}/score", json=request, headers=right, timeout=120).json()["reward"] == 0.0
    from dockyard.config.schema.env import EnvConfig
    from dockyard.envs.swe import SweEnvironment

    with pytest.raises(ValueError, match="env.scoring_secret_file: scoring servers .* need a secret"):
        SweEnvironment(EnvConfig(name="swe", sandbox_urls=[scoring_server]))
    loose = tmp_path / "loose.secret"
    loose.write_text("0123456789abcdef0123456789abcdef")
    loose.chmod(0o644)
    with pytest.raises(ValueError, match="can be read by others .*`chmod 600"):
        SweEnvironment(EnvConfig(name="swe", sandbox_urls=[scoring_server], scoring_secret_file=str(loose)))


@needs_bwrap
def test_patches_are_scored_by_the_scoring_servers_in_sandbox_urls(scoring_server, secret_file, tmp_path):
    from dockyard.config.schema.env import EnvConfig
    from dockyard.data.datasets import Prompt
    from dockyard.envs.swe import SweEnvironment
    from dockyard.envs.swe_scoring_client import ScoringServerError

    dead = "http://127.0.0.1:9"   # the discard port: nothing listens
    env = SweEnvironment(EnvConfig(name="swe", sandbox_urls=[scoring_server], reward_mode="tests_pass",
                                   scoring_secret_file=str(secret_file)))
    assert env.scorer is None    # nothing is scored on this machine
    row = json.loads((SHIPPED / "swe_bench.jsonl").read_text().splitlines()[3])
    prompt = Prompt(row["text"], row["patch"], row, "swe", str(SHIPPED / "swe_bench.jsonl"))
    assert env.score(f"<patch>\n{row['patch']}</patch>", prompt) == 1.0
    assert env.score("no patch at all", prompt) == 0.0
    assert env.judge(env.task_for(prompt), CHEAT).flagged == ["conftest.py"]
    cfg = load_config("grpo_swe_local.yaml", ["models_dir=models", f"+env.sandbox_urls=[{scoring_server}]",
                                              f"+env.scoring_secret_file={secret_file}"]).config
    out = io.StringIO()
    assert check(cfg, str(SHIPPED / "swe_pro.jsonl"), "oracle", out) == 0, out.getvalue()
    unreachable = SweEnvironment(EnvConfig(name="swe", sandbox_urls=[dead], scoring_secret_file=str(secret_file)))
    with pytest.raises(ScoringServerError, match=f"scoring server {dead} .env.sandbox_urls. did not answer /score"):
        unreachable.score(row["patch"], prompt)
    with pytest.raises(ValueError, match="env.sandbox_urls: must be a list of http"):
        SweEnvironment(EnvConfig(name="swe", sandbox_urls="node3:8900"))
    with pytest.raises(ValueError, match="env.max_output_chars: a setting of the agentic swe"):
        SweEnvironment(EnvConfig(name="swe", max_output_chars=100))


@needs_bwrap
def test_an_agents_work_tree_is_its_patch_and_edits_to_tests_are_caught():
    from dockyard.agents.tool_format import Action
    from dockyard.config.schema.env import EnvConfig
    from dockyard.data.datasets import Prompt
    from dockyard.envs.swe import SweEnvironment

    env = SweEnvironment(EnvConfig(name="swe", agent="tool_calling", sandbox=SandboxConfig(
        type="bubblewrap", command_exec_timeout_s=60, max_processes=64)))
    row = json.loads((SHIPPED / "swe_bench.jsonl").read_text().splitlines()[0])   # slugify-collapse
    [prompt] = env.prepare_prompts([Prompt(row["problem_statement"], row["patch"], row, "swe", str(SHIPPED / "swe_bench.jsonl"))])
    assert "checked out in /testbed" in prompt.input

    def episode(*commands: str) -> tuple[float, list]:
        handle = env.open(prompt)
        try:
            outputs = [handle.execute(Action("tool", "bash", {"command": c})) for c in commands]
            return handle.finish(), outputs + [handle.events[-1]]
        finally:
            handle.close()

    fix = "sed -i 's/\\[^a-z0-9\\]\"/[^a-z0-9]+\"/' textkit/slug.py"
    reward, outputs = episode("cat textkit/slug.py", fix, "python3 -m pytest -q tests 2>&1 | tail -1")
    assert "def slugify" in outputs[0] and "passed" in outputs[2]
    assert reward == 1.0, outputs[-1]
    assert "+    text = re.sub(r\"[^a-z0-9]+\", \"-\", text)" in outputs[-1]["patch"]
    assert "__pycache__" not in outputs[-1]["patch"]          # the agent's test run left caches; not part of the patch
    assert episode("ls")[0] == 0.0                            # no work
    # a diff driver in the repository's own .git/config would run the agent's command as the verifier
    # and forge the patch: the verifier takes the patch under the configuration from before the agent
    forge = ("git config diff.external \"sh -c 'echo forged > /tmp/ran; echo forged'\" && "
             "printf '* diff=x\\n' > .git/info/attributes && git config diff.x.textconv 'sh -c \"echo forged\"'")
    reward, outputs = episode(fix, forge)
    assert reward == 1.0 and "forged" not in outputs[-1]["patch"], outputs[-1]
    assert "+    text = re.sub(r\"[^a-z0-9]+\", \"-\", text)" in outputs[-1]["patch"]
    cheat = "printf 'import pytest\\n' > conftest.py"
    reward, outputs = episode(fix, cheat)
    assert reward == 0.0 and outputs[-1]["flagged"] == ["conftest.py"]
