"""The grader against an adversarial policy: tasks whose oracle solution attacks the grade instead of doing
the task (tests/envs/adversarial_tasks/, one per class of attack), run through the oracle agent in
bubblewrap and in podman. Every attack must score 0 and every honest twin 1; on this project's
grader before these guards, every attack but the late writer scored 1 (or nan, or 3e8), in both
sandboxes (tests/envs/adversarial_tasks/README.md lists them). The classes the task set cannot show (processes outliving the agent in its shell, output
floods, the network, crashed trainers, links and forged end markers) have tests of their own in
tests/sandboxes/test_guards.py."""

import os
import shutil
from pathlib import Path

import pytest
import yaml

from dockyard.config.schema.env import SandboxConfig
from dockyard.envs.terminal_tasks import load_task, load_tasks
from dockyard.envs.terminal_trial import oracle_agent, run_trial
from dockyard.sandboxes.bubblewrap import bwrap_path
from dockyard.sandboxes.factory import SandboxFactory
from dockyard.sandboxes.podman import podman_path
from dockyard.sandboxes.processes import live_processes, of_user

ATTACKS = Path(__file__).parent / "adversarial_tasks"
KINDS = [pytest.param("bubblewrap", marks=pytest.mark.skipif(bwrap_path() is None, reason="bubblewrap is not installed")),
         pytest.param("podman", marks=pytest.mark.skipif(podman_path() is None, reason="podman is not installed"))]
# what the workspace scan must report for the attacks that leave files behind
LEFT_BEHIND = {"shadow-pytest-module": "/app/pytest.py", "shadow-pytest-package": "/app/pytest",
               "usercustomize": "/usercustomize.py", "pth-file": "/zz-grade.pth", "conftest-rewrites-reports": "/app/conftest.py",
               "sitecustomize-on-pythonpath": "/app/lib/sitecustomize.py", "interpreter-on-path": "/app/bin/python3",
               "entry-point-plugin": "passall-1.0.dist-info/entry_points.txt", "ini-file-in-workspace": "/app/pytest.ini"}
VERIFIER_ERRORS = {"conftest-rewrites-reports": "configuration file the agent could have written: /app/conftest.py",
                   "conftest-planted-in-tests": "configuration file the agent could have written: /tests/conftest.py",
                   "reward-out-of-range": "holds 333333333.3333333, outside the task's reward range [0, 1]",
                   "reward-nan": "holds nan, outside"}


def honest_twin(task_folder: Path, where: Path) -> Path:
    """The same task with its honest solution in the layout's solution file."""
    twin = where / task_folder.name
    shutil.copytree(task_folder, twin)
    honest = next(twin.glob("honest_solution.*"))
    for attack in ("solution.sh", "solution.yaml", "solution/solve.sh"):
        (twin / attack).unlink(missing_ok=True)
    harbor = (twin / "task.toml").is_file()
    honest.rename(twin / ("solution/solve.sh" if harbor else f"solution{honest.suffix}"))
    return twin


@pytest.mark.parametrize("kind", KINDS)
def test_every_attack_scores_zero_and_every_honest_twin_one(kind, tmp_path):
    factory = SandboxFactory(SandboxConfig(type=kind, command_exec_timeout_s=60, max_concurrent=4))
    survivors = {}

    def oracle_then_look(task, sandbox):
        if task.solution.suffix == ".yaml":
            # as in an episode, the agent's shell is still open when its time is over (the oracle would close it)
            shell = sandbox.shell()
            output = "\n".join(shell.run(step["command"].rstrip("\n")).output for step in yaml.safe_load(task.solution.read_text()))
        else:
            output = oracle_agent(task, sandbox)
        if os.geteuid() == 0:   # what of the agent still runs when its time is over (the late writer)
            survivors[task.name] = live_processes(of_user(sandbox.uid))
        return output

    tasks = load_tasks(ATTACKS)
    assert len(tasks) == 13
    for task in tasks:
        attacked = run_trial(task, factory.create, oracle_then_look)
        assert attacked.error is None and attacked.reward == 0.0, (task.name, attacked.test_output[-800:])
        if task.name in LEFT_BEHIND:
            assert any(LEFT_BEHIND[task.name] in path for path in attacked.suspicious), (task.name, attacked.suspicious)
        if task.name in VERIFIER_ERRORS:
            assert VERIFIER_ERRORS[task.name] in (attacked.verifier_error or ""), (task.name, attacked.verifier_error)
        honest = run_trial(load_task(honest_twin(task.folder, tmp_path)), factory.create, oracle_agent)
        assert honest.error is None and honest.reward == 1.0, (task.name, honest.test_output[-800:])
        assert not honest.suspicious and honest.verifier_error is None, task.name
    if os.geteuid() == 0:   # the late writer was alive when the agent's time ended: the hand-over ended it
        assert survivors["late-writer"], "the late writer's process did not outlive the agent's commands"


@pytest.mark.parametrize("kind", KINDS)
def test_grading_in_a_fresh_sandbox_receives_only_the_workspace(kind, tmp_path):
    """env.grading: fresh_sandbox: the tests run in a new sandbox built from the task, holding only what the
    agent left in its working directory (links kept as links): nothing it left elsewhere (podman's /tmp
    outlives a command; bubblewrap's does not) and none of its processes."""
    task_dir = tmp_path / "fresh-grading"
    (task_dir / "environment").mkdir(parents=True)
    (task_dir / "tests").mkdir()
    (task_dir / "environment" / "data.txt").write_text("one\ntwo\nthree\n")
    (task_dir / "environment" / "Dockerfile").write_text("FROM ubuntu:24.04\nWORKDIR /app\nCOPY data.txt /app/data.txt\n")
    (task_dir / "instruction.md").write_text("Count the lines of data.txt into count.txt.\n")
    (task_dir / "task.toml").write_text("[verifier]\ntimeout_sec = 60.0\n")
    (task_dir / "tests" / "test.sh").write_text(
        "#!/bin/bash\nok=1\n[ \"$(cat /app/count.txt)\" = 3 ] || ok=0\n[ -L /app/link.txt ] || ok=0\n"
        "[ -e /tmp/agent-note ] && ok=0\necho $ok > /logs/verifier/reward.txt\n")
    task = load_task(task_dir)
    factory = SandboxFactory(SandboxConfig(type=kind, command_exec_timeout_s=60, max_concurrent=2))
    first = []

    def agent(task, sandbox):
        first.append(sandbox)
        return sandbox.run("wc -l < data.txt > count.txt && ln -s count.txt link.txt && echo x > /tmp/agent-note").output

    fresh = run_trial(task, factory.create, agent, grading="fresh_sandbox")
    assert fresh.reward == 1.0 and fresh.error is None, fresh.test_output[-500:]
    assert first[0].destroyed
    same = run_trial(task, factory.create, agent)
    assert same.error is None and same.reward == (0.0 if kind == "podman" else 1.0), same.test_output[-500:]
