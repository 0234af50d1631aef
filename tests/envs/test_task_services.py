"""docker-compose services beside a task's main one (env.sandbox.task_images: build): in podman each runs
from its own built image in a container of its own on the sandbox's network, reachable by its name, for
the agent's turn and the tests; in bubblewrap they are refused by name; compose keys a service beside
the main one cannot honour are refused at load."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from dockyard.config.schema.env import SandboxConfig
from dockyard.envs.terminal_bench import task_images
from dockyard.envs.terminal_tasks import TaskFormatError, load_task
from dockyard.envs.terminal_trial import noop_agent, oracle_agent, run_trial
from dockyard.sandboxes.bubblewrap import bwrap_path
from dockyard.sandboxes.factory import SandboxFactory
from dockyard.sandboxes.podman import podman_path
from tests.envs.conftest import BASE

TASK = Path(__file__).parent / "service_tasks" / "tb1-service-api"
needs_builder = pytest.mark.skipif(podman_path() is None or os.geteuid() != 0,
                                   reason="task images are built with podman as root (tools/install.sh)")


def factory(kind: str, open_folder: Path) -> SandboxFactory:
    return SandboxFactory(SandboxConfig(type=kind, task_images="build", default_base_image=BASE,
                                        image_cache=str(open_folder / "cache"), command_exec_timeout_s=120,
                                        max_concurrent=2))


def containers_named(prefix: str) -> list[str]:
    out = subprocess.run(["podman", "ps", "-a", "--format", "{{.Names}}"], capture_output=True, text=True, check=True)
    return [name for name in out.stdout.split() if name.startswith(prefix)]


def agent_that_kills_what_it_can_then_solves(task, sandbox) -> str:
    """Everything the agent can signal dies first; the service is not among it (its own container). It
    also replaces one of the tests' tools (root inside), which the verifier restores before the tests by
    restarting the task's container: the service must still be on its network after that."""
    sandbox.run("pkill -9 -f serve.py; kill -9 -1; true")
    sandbox.run("cp /bin/true /usr/local/bin/uv")
    return oracle_agent(task, sandbox)


@needs_builder
def test_a_service_beside_the_main_one_runs_in_podman_for_the_agent_and_the_tests(base_image, open_folder):
    task = load_task(TASK)
    assert [s.name for s in task.sidecars] == ["api"] and task.sidecars[0].env == {"API_PORT": "8000"}
    sandboxes = factory("podman", open_folder)
    image = task_images(sandboxes, task)
    assert set(image.services) == {"api"} and image.services["api"].rootfs is None   # podman runs it by tag
    solved = run_trial(task, sandboxes.create, oracle_agent, image=image)
    assert solved.reward == 1.0 and solved.tests_ran == "pytest", (solved.error, solved.test_output[-2000:])
    assert any(note.startswith("service api beside it: FROM python:3.12-slim built on") for note in solved.notes)
    # the secret is made when the service starts: nothing but asking it gives the answer, and a no-op fails
    noop = run_trial(task, sandboxes.create, noop_agent, image=image)
    assert noop.reward == 0.0 and noop.tests_ran == "pytest" and "answer.txt" in noop.test_output
    # the agent cannot end the service (another container's processes), and the trial removes it
    survived = run_trial(task, sandboxes.create, agent_that_kills_what_it_can_then_solves, image=image)
    assert survived.reward == 1.0, (survived.error, survived.test_output[-2000:])
    assert any(note.startswith("the image's own version restored") and "/usr/local/bin/uv" in note
               for note in survived.notes), survived.notes
    assert [name for name in containers_named("dockyard-") if name.endswith("-api")] == []


@needs_builder
@pytest.mark.skipif(bwrap_path() is None, reason="bubblewrap is not installed")
def test_bubblewrap_refuses_a_task_with_services_by_name(base_image, open_folder):
    task = load_task(TASK)
    sandboxes = factory("bubblewrap", open_folder)
    image = task_images(sandboxes, task)
    assert image.services == {}   # not built where they cannot run
    result = run_trial(task, sandboxes.create, oracle_agent, image=image)
    assert result.reward == 0.0 and result.error.startswith(
        "task tb1-service-api: its docker-compose services beside the main one (api) run only in podman sandboxes")


def test_compose_keys_a_service_cannot_honour_are_refused_naming_them(tmp_path):
    task = tmp_path / "task"
    shutil.copytree(TASK, task)
    compose = (task / "docker-compose.yaml").read_text()
    (task / "docker-compose.yaml").write_text(compose + "    volumes:\n      - shared:/data\n")
    with pytest.raises(TaskFormatError, match=r"service 'api' uses volumes, which a service beside the main one "
                                              r"does not support here"):
        load_task(task)
    (task / "docker-compose.yaml").write_text(compose.replace("    build:\n      context: ./api\n",
                                                              "    image: redis:7\n    command: redis-server --port 8000\n"))
    [sidecar] = load_task(task).sidecars
    assert sidecar.image == "redis:7" and sidecar.dockerfile is None
    assert sidecar.command == ["redis-server", "--port", "8000"]
    (task / "docker-compose.yaml").write_text(compose.replace("    build:\n      context: ./api\n", ""))
    with pytest.raises(TaskFormatError, match="service 'api' has neither `build` nor `image`"):
        load_task(task)
