"""Published Harbor tasks, copied unchanged (tests/envs/published_tasks/README.md), through
`dockyard env check` as a new user would run it: their images built on the local base, their own
test scripts (pytest installed with uvx from PyPI at test time) run by a verifier with the network."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from dockyard.sandboxes.podman import podman_path
from tests.conftest import REPO

CORPUS = Path(__file__).parent / "published_tasks" / "harbor-cookbook"
BASE = "localhost/dockyard-base:bookworm"
needs_builder = pytest.mark.skipif(podman_path() is None or os.geteuid() != 0,
                                   reason="task images are built with podman as root (tools/install.sh)")


def env_check(kind: str, agent: str, logs: Path) -> subprocess.CompletedProcess:
    built = subprocess.run(["bash", str(REPO / "tools" / "build_base_image.sh"), BASE], capture_output=True, text=True,
                           timeout=900)
    assert built.returncode == 0, built.stderr
    return subprocess.run([sys.executable, "-m", "dockyard.cli", "env", "check", "--config",
                           "grpo_terminal_bench_local.yaml", "--tasks", str(CORPUS), "--agent", agent,
                           "--logs", str(logs), f"env.sandbox.type={kind}", "env.sandbox.task_images=build",
                           f"env.sandbox.default_base_image={BASE}", "+env.verifier_allow_internet=true",
                           "env.num_workers=2"], capture_output=True, text=True, timeout=1800, cwd=REPO)


def rows(output: str) -> dict[str, list[str]]:
    """task -> [reward, tests ran, seconds, notes] from the table between its header and its mean."""
    lines = output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("task ") and "reward  tests" in line)
    table = lines[start + 1:next(i for i, line in enumerate(lines) if line.startswith("mean reward"))]
    return {line.split()[0]: line.split(None, 4)[1:] for line in table if line.strip()}


@needs_builder
@pytest.mark.parametrize("kind", ["bubblewrap", "podman"])
def test_published_harbor_tasks_score_as_their_authors_meant_or_say_why_not(kind, tmp_path):
    oracle = env_check(kind, "oracle", tmp_path / "oracle")
    assert oracle.returncode == 1, oracle.stdout + oracle.stderr   # the tasks below that cannot pass here
    got = rows(oracle.stdout)
    assert set(got) == {"simple-task", "skills", "dns-blacklisting", "multi-reward", "multi-container"}, oracle.stdout
    # its api-server service (compose, with a healthcheck the agent waits for) runs beside it in podman only
    solved = ("simple-task", "skills") + (("multi-container",) if kind == "podman" else ())
    if kind == "bubblewrap":
        assert got["multi-container"][0] == "0.00" and "services beside the main one (api-server) run only in " \
            "podman sandboxes" in oracle.stdout, oracle.stdout
    for task in solved:
        assert got[task][:2] == ["1.00", "pytest"], (task, (tmp_path / "oracle" / f"{task}.log").read_text()[-2000:])
    assert got["dns-blacklisting"][0] == "0.00" and "ENTRYPOINT /entrypoint.sh is not run" in got["dns-blacklisting"][3]
    assert got["multi-reward"][0] == "0.00" and "names rewards correctness, performance but none `reward`" in \
        got["multi-reward"][3]
    noop = env_check(kind, "noop", tmp_path / "noop")
    for task, (reward, tests_ran, *_) in rows(noop.stdout).items():
        if (kind, task) == ("bubblewrap", "multi-container"):
            continue   # refused, as above
        assert reward == "0.00" and tests_ran == "pytest", (task, noop.stdout)   # the tests ran and failed
