"""Terminal-Bench 1's standard test harness (curl and uv fetched at test time, `uv venv .tbench-testing`
in the working folder, a pinned pytest, `uv run pytest`) graded for real in both sandboxes, and the two
ways an agent made that harness run a pytest of its own (dockyard/envs/hand_over.py, grading.py)."""

import os
import shlex
from pathlib import Path

import pytest

from dockyard.config.schema.env import SandboxConfig
from dockyard.envs.terminal_tasks import load_task
from dockyard.envs.terminal_trial import NetworkPolicy, oracle_agent, run_trial
from dockyard.sandboxes.factory import SandboxFactory
from dockyard.sandboxes.podman import podman_path
from tests.envs.conftest import BASE

TASKS = Path(__file__).parent / "harness_tasks"
ATTACKS = TASKS / "attacks"
# the two harnesses Terminal-Bench 1 tasks ship: `uv venv .tbench-testing` + `uv pip install`, and
# `uv init` + `uv add` (a project in the working folder, its environment in .venv there)
HARNESSES = ["tb1-uv-harness", "tb1-uv-init-harness"]
needs_builder = pytest.mark.skipif(podman_path() is None or os.geteuid() != 0,
                                   reason="task images are built with podman as root (tools/install.sh)")


def _factory(kind: str, cache: Path) -> SandboxFactory:
    return SandboxFactory(SandboxConfig(type=kind, task_images="build", default_base_image=BASE,
                                        image_cache=str(cache), command_exec_timeout_s=300, max_concurrent=2))


def _noop(task, sandbox) -> str:
    return ""


@needs_builder
@pytest.mark.parametrize("kind", ["bubblewrap", "podman"])
@pytest.mark.parametrize("harness", HARNESSES)
def test_the_harness_builds_its_environment_in_the_working_folder_and_its_tests_decide(harness, kind, base_image,
                                                                                     open_folder):
    factory = _factory(kind, open_folder / "cache")
    task = load_task(TASKS / harness)
    image = factory.task_image(task.name, task.dockerfile, task.build_context)
    online = NetworkPolicy(verifier=True)   # `uv pip install pytest==8.4.1` reaches PyPI
    oracle = run_trial(task, factory.create, oracle_agent, image=image, policy=online)
    assert oracle.error is None and oracle.verifier_error is None and oracle.reward == 1.0, \
        (oracle.notes, oracle.test_output[-1500:])
    # the harness's own pytest ran from its environment in /app (the base image has Debian's 7.2)
    assert oracle.tests_ran == "pytest" and "pytest-8.4.1" in oracle.test_output
    noop = run_trial(task, factory.create, _noop, image=image, policy=online)
    assert noop.verifier_error is None and noop.reward == 0.0 and "FAILED" in noop.test_output, noop.test_output[-800:]


@needs_builder
@pytest.mark.parametrize("kind", ["bubblewrap", "podman"])
@pytest.mark.parametrize("attack, harness", [("planted-harness-venv", "tb1-uv-harness"),
                                             ("agent-uv-project", "tb1-uv-harness"),
                                             ("left-project-environment", "tb1-uv-init-harness")])
def test_an_agent_cannot_make_the_harness_run_a_pytest_of_its_own(attack, harness, kind, base_image, open_folder):
    # each attack leaves a `pytest` or a .pth file that writes a record of two passed tests; before the
    # guards each scored 1 without the task done (the first two with the verifier's network on and off)
    script = (ATTACKS / f"{attack}.sh").read_text()

    def attacker(task, sandbox) -> str:
        return sandbox.run(f"bash -c {shlex.quote(script)}").output
    factory = _factory(kind, open_folder / "cache")
    task = load_task(TASKS / harness)
    image = factory.task_image(task.name, task.dockerfile, task.build_context)
    for verifier_network in (False, True):
        result = run_trial(task, factory.create, attacker, image=image, policy=NetworkPolicy(verifier=verifier_network))
        assert result.error is None and result.reward == 0.0, (verifier_network, result.notes, result.test_output[-800:])
        # the real tests ran and failed (the task was not done): the agent's pytest never ran
        assert "FAILED" in result.test_output and "1 of 2 tests failed" in result.test_output   # no forged record
        assert result.suspicious   # what it left is counted all the same
        expected = {"agent-uv-project": "uv ran the tests without the project of /app/pyproject.toml",
                    "left-project-environment": "start-up hooks the agent left were made unreadable"}.get(attack)
        assert expected is None or any(note.startswith(expected) for note in result.notes), result.notes

