"""Published SWE-bench rows scored as the official harness scores them: its test directives (new names,
no data files, django's module paths), its per-repository commands and log parsers, its grading, and
per-row environments built from its specification (a venv on the Python it names, the repository
installed at /testbed), in bubblewrap and in podman."""

import io
import json
import os
import shutil
import subprocess

import pytest

from dockyard.config.schema.env import SandboxConfig
from dockyard.envs import swe_harness
from dockyard.envs.swe import SweScorer, command_for, integrity_findings
from dockyard.envs.swe_environments import (EnvironmentBuilder, choose_python, conda_to_pip, pyenv_pythons,
                                            requirements_from_environment_yml)
from dockyard.envs.swe_tasks import RepoStore, SweTaskError, read_task_file, task_from_row
from dockyard.sandboxes.bubblewrap import bwrap_path
from dockyard.sandboxes.factory import SandboxFactory
from tests.conftest import REPO

SHIPPED = REPO / "tasks" / "swe"
RENAME_AND_DATA = """diff --git a/tests/test_old.py b/tests/test_new.py
similarity index 90%
rename from tests/test_old.py
rename to tests/test_new.py
--- a/tests/test_old.py
+++ b/tests/test_new.py
@@ -1 +1 @@
-def test_a(): pass
+def test_a(): assert True
diff --git a/test/fixtures/config.toml b/test/fixtures/config.toml
--- a/test/fixtures/config.toml
+++ b/test/fixtures/config.toml
@@ -1 +1 @@
-a = 1
+a = 2
"""


def row(**fields) -> dict:
    base = {"instance_id": "owner__name-1", "repo": "owner/name", "base_commit": "0" * 40, "version": "1.0",
            "test_patch": RENAME_AND_DATA, "patch": "", "FAIL_TO_PASS": '["tests/test_new.py::test_a"]',
            "PASS_TO_PASS": "[]"}
    return {**base, **fields}


def test_directives_are_the_harnesss_new_names_without_data_files_and_djangos_module_paths():
    # the two ways the old scorer lost published rows: a renamed file's old name, a .toml fixture
    assert task_from_row(row(), "rows.jsonl").test_files == ["tests/test_new.py"]
    django = task_from_row(row(repo="django/django", version="4.2", test_patch=(
        "diff --git a/tests/sitemaps_tests/test_http.py b/tests/sitemaps_tests/test_http.py\n"
        "diff --git a/tests/sitemaps_tests/urls/http.py b/tests/sitemaps_tests/urls/http.py\n")), "rows.jsonl")
    assert django.test_files == ["sitemaps_tests.test_http", "sitemaps_tests.urls.http"]
    built = command_for(django, built=True)
    assert built.startswith("./tests/runtests.py --verbosity 2 --settings=test_sqlite --parallel 1 ")
    assert built.endswith("sitemaps_tests.test_http sitemaps_tests.urls.http")
    # a pytest repository on the sandbox's own Python runs pytest there; its environment runs the harness's
    astroid = task_from_row(row(repo="pylint-dev/astroid", version="2.9"), "rows.jsonl")
    assert command_for(astroid, built=True) == "pytest -rA tests/test_new.py"
    assert command_for(astroid, built=False) == "python3 -m pytest -rA -p no:cacheprovider tests/test_new.py"
    assert command_for(task_from_row(row(test_cmd="make check"), "rows.jsonl"), built=True) == "make check"


def test_statuses_come_from_the_repositorys_parser_and_resolution_from_the_harnesss_grading():
    sympy = task_from_row(row(repo="sympy/sympy", version="1.1", FAIL_TO_PASS='["test_hstack"]',
                              PASS_TO_PASS='["test_add", "test_trace"]'), "rows.jsonl")
    command = command_for(sympy, built=True)
    assert command.startswith("PYTHONWARNINGS=") and " bin/test -C --verbose " in command
    log = "sympy/matrices/tests/test_sparse.py[3]\ntest_add ok\ntest_trace ok\ntest_hstack F\n"
    statuses, problem = SweScorer.statuses(sympy, command, "", log, [], [])
    assert problem is None and statuses == {"test_add": "PASSED", "test_trace": "PASSED", "test_hstack": "FAILED"}
    report, resolution = swe_harness.grade(sympy.fail_to_pass, sympy.pass_to_pass, statuses)
    assert resolution == "RESOLVED_NO" and report["FAIL_TO_PASS"]["failure"] == ["test_hstack"]
    statuses["test_hstack"] = "PASSED"
    assert swe_harness.grade(sympy.fail_to_pass, sympy.pass_to_pass, statuses)[1] == "RESOLVED_FULL"
    # a test the run never reached counts as failed, as on the leaderboard
    assert swe_harness.grade(["test_missing"], [], statuses)[1] == "RESOLVED_NO"
    # pytest rows read pytest's own record (here: one that says the test passed), never the printed summary
    astroid = task_from_row(row(repo="pylint-dev/astroid", version="2.9"), "rows.jsonl")
    printed = "PASSED tests/test_new.py::test_a\n"
    assert SweScorer.statuses(astroid, "pytest -rA tests/test_new.py", "", printed, [], [])[1][0].startswith(
        "pytest wrote no record")


def test_pro_rows_published_lists_python_style_are_read():
    def pro_row(**fields):
        return {k: v for k, v in row(**fields).items() if k not in ("FAIL_TO_PASS", "PASS_TO_PASS")}

    pro = task_from_row(pro_row(fail_to_pass="['TestOne', \"TestTwo's\"]", pass_to_pass="[]",
                                selected_test_files_to_run='["tests/unit/test_dummy.py"]'), "pro.jsonl")
    assert pro.fail_to_pass == ["TestOne", "TestTwo's"] and pro.test_files == ["tests/unit/test_dummy.py"]
    with pytest.raises(SweTaskError, match="fail_to_pass is not a JSON \\(or Python\\) list of test ids"):
        task_from_row(pro_row(fail_to_pass="[TestOne", pass_to_pass="[]"), "pro.jsonl")


def test_a_patch_that_edits_the_test_runner_is_flagged():
    sympy = task_from_row(row(repo="sympy/sympy", version="1.1"), "rows.jsonl")
    runner = "diff --git a/bin/test b/bin/test\n--- a/bin/test\n+++ b/bin/test\n@@ -1 +1 @@\n-a\n+b\n"
    assert integrity_findings(sympy, runner, command_for(sympy, built=True)) == ["bin/test"]
    fix = "diff --git a/sympy/core/add.py b/sympy/core/add.py\n--- a/sympy/core/add.py\n+++ b/sympy/core/add.py\n"
    assert integrity_findings(sympy, fix, command_for(sympy, built=True)) == []


def test_the_python_the_specification_names_or_the_nearest_announced_or_refused_by_name():
    have = {"3.6": None, "3.9": None, "3.11": None, "2.7": None}
    assert choose_python("3.9", have, "exact", "row x") == ("3.9", None)
    version, note = choose_python("3.8", have, "nearest", "row x")
    assert version == "3.9" and "needs Python 3.8" in note and "Python 3.9 instead" in note
    assert choose_python("3.5", have, "nearest", "row x")[0] == "3.6"
    with pytest.raises(SweTaskError, match=r"row x: needs Python 3\.8, which this machine does not have"):
        choose_python("3.8", have, "exact", "row x")


def test_conda_packages_and_environment_files_become_pip_requirements():
    assert conda_to_pip("numpy=1.19") == "numpy==1.19.*" and conda_to_pip("scipy==1.5.2") == "scipy==1.5.2"
    assert conda_to_pip("python=3.9") is None and conda_to_pip("cython") == "cython"
    yml = "name: x\ndependencies:\n  - python=3.9\n  - numpy>=1.20\n  - conda-forge::pandas=1.3.5\n  - pip\n  - pip:\n    - pytest-xdist\n"
    assert requirements_from_environment_yml(yml, "row") == ["numpy>=1.20", "pandas==1.3.5", "pytest-xdist"]


def test_an_unknown_repository_or_version_is_refused_by_name(tmp_path):
    builder = EnvironmentBuilder(None, RepoStore(tmp_path), None)
    with pytest.raises(SweTaskError, match=r"no specification for sympy/sympy version '0\.0' \(it knows .*1\.1"):
        builder.spec(task_from_row(row(repo="sympy/sympy", version="0.0"), "rows.jsonl"))
    with pytest.raises(SweTaskError, match=r"owner/name \(not one of its repositories\)"):
        builder.spec(task_from_row(row(), "rows.jsonl"))


# --- a row's own environment, built from a specification in the harness's format -----------------------
# minicalc is this project's repository, unknown to the harness: the specification is given to it here
# the way the harness holds its own (Python version, pip packages, install and test commands). It has no
# packaging, so its install puts /testbed on the venv's path (what `pip install -e .` does); without the
# install, `pytest -rA` could not import minicalc
MINICALC_SPEC = {"python": "3.9", "pip_packages": ["pytest==8.3.5"],
                 "install": "python -c 'import sysconfig; print(sysconfig.get_paths()[\"purelib\"])' | "
                            "xargs -I{} sh -c 'echo /testbed > {}/testbed.pth'",
                 "test_cmd": "pytest -rA", "eval_commands": ["export MINICALC_MODE=harness"]}


@pytest.fixture(scope="module")
def minicalc_rows():
    tasks, problems = read_task_file(SHIPPED / "swe_bench.jsonl")
    assert not problems
    return {t.instance_id: t for t in tasks if t.repo == "dockyard-tasks/minicalc"}


@pytest.mark.parametrize("kind", ["bubblewrap", "podman"])
def test_a_rows_environment_is_built_once_and_scores_gold_1_and_no_op_0(kind, minicalc_rows, monkeypatch, base_image,
                                                                      open_folder):
    if kind == "bubblewrap" and bwrap_path() is None or shutil.which("podman") is None or os.geteuid() != 0:
        pytest.skip(f"{kind} or podman is not installed (tools/install.sh), or not root")
    real_spec = swe_harness.spec_for
    monkeypatch.setattr(swe_harness, "spec_for", lambda repo, version: MINICALC_SPEC
                        if repo == "dockyard-tasks/minicalc" else real_spec(repo, version))
    monkeypatch.setattr(swe_harness, "repo_install", lambda repo: None)
    factory = SandboxFactory(SandboxConfig(type=kind, task_images="build", command_exec_timeout_s=120, max_concurrent=2,
                                           image_cache=str(open_folder / "images")))
    repos = RepoStore(None)
    try:
        environments = EnvironmentBuilder(factory.images, repos, base_image)
        scorer = SweScorer(factory, repos, "binary", True, environments)
        task = minicalc_rows["dockyard-tasks__minicalc-mean-empty"]
        gold = scorer.score(task, task.patch)
        assert gold.reward == 1.0 and gold.resolved, gold.log
        assert "+ pytest -rA tests/test_stats.py" in gold.log, gold.log
        wanted = "3.9" if "3.9" in pyenv_pythons() else "3.11"
        assert f"Python {wanted}" in gold.log, gold.log      # the venv's interpreter ran the tests
        assert ("needs Python 3.9" in " ".join(gold.notes)) == (wanted != "3.9")
        noop = scorer.score(task, "")
        assert noop.reward == 0.0 and not noop.resolved and "FAIL_TO_PASS 0/1" in noop.log, noop.log
        # a second row of the same repository, version and base commit is built on the same images: the
        # repository travels as a bundle whose bytes depend only on its commits
        other = minicalc_rows["dockyard-tasks__minicalc-median-even"]
        assert scorer.score(other, other.patch).reward == 1.0
        first, second = environments.environment_for(task), environments.environment_for(other)
        assert first.image.tag == second.image.tag and not second.image.built_now
        assert first.test_env == {"MINICALC_MODE": "harness"}
    finally:
        repos.close()
    assert not repos._scratch.exists()


def git(*argv, cwd) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *argv], cwd=cwd, capture_output=True,
                          text=True, check=True).stdout


def test_the_repository_in_an_environment_has_no_later_history_but_keeps_earlier_tags(minicalc_rows, tmp_path):
    task = minicalc_rows["dockyard-tasks__minicalc-mean-empty"]
    clone = tmp_path / "repos" / "dockyard-tasks__minicalc"
    git("clone", "-q", str(SHIPPED / "repos" / "dockyard-tasks__minicalc.bundle"), str(clone), cwd=tmp_path)
    git("tag", "v0.1", task.base_commit, cwd=clone)
    (clone / "minicalc" / "stats.py").write_text("# the fix, committed later\n")
    git("commit", "-qam", "the reference fix", cwd=clone)
    git("tag", "v0.2", cwd=clone)
    later = git("rev-parse", "HEAD", cwd=clone).strip()
    repos = RepoStore(tmp_path / "repos")
    try:
        repos.export(task, tmp_path / "testbed")
        exported = tmp_path / "testbed"
        history = git("log", "--all", "--format=%H", cwd=exported).split()
        assert history == [task.base_commit] and later not in history
        assert git("tag", cwd=exported).split() == ["v0.1"]
        assert subprocess.run(["git", "cat-file", "-e", later], cwd=exported).returncode != 0
        assert (exported / "minicalc" / "stats.py").read_text() != "# the fix, committed later\n"
    finally:
        repos.close()


def test_a_row_refused_at_check_time_names_its_cause(tmp_path):
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps(row(repo="sympy/sympy", version="0.0")) + "\n")
    task = read_task_file(rows)[0][0]
    with pytest.raises(SweTaskError, match=r"rows.jsonl:1: task owner__name-1: the SWE-bench harness has no "):
        EnvironmentBuilder(None, RepoStore(tmp_path), None).spec(task)


@pytest.mark.skipif(bwrap_path() is None or shutil.which("podman") is None or os.geteuid() != 0,
                    reason="bubblewrap and podman as root (tools/install.sh)")
def test_env_check_names_each_rows_cause_when_no_environment_can_be_made(tmp_path):
    from dockyard.config import load_config
    from dockyard.envs.check import check

    shipped = [json.loads(line) for line in (SHIPPED / "swe_bench.jsonl").read_text().splitlines()]
    rows = [{**shipped[0], "instance_id": "old-version", "repo": "sympy/sympy", "version": "0.0"},
            {**shipped[1], "instance_id": "own-image", "image_name": "swebench/swesmith.x86_64.owner__name.abc123"},
            {**shipped[2], "instance_id": "no-repository", "repo": "pylint-dev/astroid", "version": "2.9"}]
    file = tmp_path / "rows.jsonl"
    file.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "repos").symlink_to(SHIPPED / "repos")
    cfg = load_config("grpo_swe_local.yaml", ["models_dir=models", "env.sandbox.task_images=build",
                                              "+env.python_versions=exact"]).config
    out = io.StringIO()
    assert check(cfg, str(file), "oracle", out) == 1
    report = out.getvalue()
    assert "BROKEN old-version [no environment]: " in report and "no specification for sympy/sympy version '0.0'" in report
    assert "BROKEN own-image [no environment]: " in report and "swebench/swesmith.x86_64.owner__name.abc123" in report
    assert "BROKEN no-repository [repository]: " in report and "repository pylint-dev/astroid not found" in report
    assert "Traceback" not in report
    # `dockyard env build` names the same causes, one line per row
    from dockyard.envs.swe import SweEnvironment

    built = io.StringIO()
    assert SweEnvironment.build_command(cfg, file, built) == 1
    lines = built.getvalue().splitlines()
    assert lines[0].startswith("[1/3] old-version: failed: ") and "no specification for sympy/sympy" in lines[0]
    assert lines[2].startswith("[3/3] no-repository: failed: ") and lines[-1].startswith("3 rows: 0 built, 0 cached, 3 failed")


@pytest.mark.skipif(bwrap_path() is None or shutil.which("podman") is None or os.geteuid() != 0,
                    reason="bubblewrap and podman as root (tools/install.sh)")
def test_an_agent_on_a_built_environment_works_from_the_set_up_commit(monkeypatch, base_image, open_folder):
    from dockyard.agents.tool_format import Action
    from dockyard.config.schema.env import EnvConfig
    from dockyard.data.datasets import Prompt
    from dockyard.envs.swe import SweEnvironment

    real_spec = swe_harness.spec_for
    monkeypatch.setattr(swe_harness, "spec_for", lambda repo, version: MINICALC_SPEC
                        if repo == "dockyard-tasks/minicalc" else real_spec(repo, version))
    monkeypatch.setattr(swe_harness, "repo_install", lambda repo: None)
    env = SweEnvironment(EnvConfig(name="swe", agent="tool_calling", sandbox=SandboxConfig(
        type="bubblewrap", task_images="build", default_base_image=base_image, image_cache=str(open_folder / "images"),
        command_exec_timeout_s=120, max_processes=64)))
    row = next(json.loads(line) for line in (SHIPPED / "swe_bench.jsonl").read_text().splitlines()
               if "minicalc-mean-empty" in line)
    prompt = Prompt(row["problem_statement"], row["patch"], row, "swe", str(SHIPPED / "swe_bench.jsonl"))
    handle = env.open(prompt)
    try:
        # the set-up (the venv's .pth) is in the harness's commit, not in the agent's diff; the agent's
        # own commit does not hide its work either
        assert handle.start != row["base_commit"]
        fix = ("python - <<'EOF'\nimport pathlib\np = pathlib.Path('minicalc/stats.py')\nt = p.read_text()\n"
               "p.write_text(t.replace('    return sum(values) / len(values)', "
               "'    if not values:\\n        raise ValueError(\"mean of no values\")\\n    return sum(values) / len(values)'))\nEOF")
        handle.execute(Action("tool", "bash", {"command": fix}))
        handle.execute(Action("tool", "bash", {"command": "git -c user.name=a -c user.email=a@a commit -qam mine"}))
        reward = handle.finish()
        assert reward == 1.0, handle.events[-1]
        assert "raise ValueError" in handle.events[-1]["patch"] and "testbed.pth" not in handle.events[-1]["patch"]
    finally:
        handle.close()
        env.repos.close()
