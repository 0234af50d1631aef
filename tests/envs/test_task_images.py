"""Task images (env.sandbox.task_images: build): Dockerfiles read as Docker reads them, built for real
with podman on a local Debian base (tools/build_base_image.sh), cached, and run in both sandboxes."""

import os
import secrets
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from dockyard.config.schema.env import SandboxConfig
from dockyard.envs.terminal_tasks import TaskFormatError, load_task, load_tasks, parse_dockerfile
from dockyard.envs.terminal_trial import NetworkPolicy, oracle_agent, run_trial, sandbox_spec
from dockyard.sandboxes.base import SandboxError
from dockyard.sandboxes.factory import SandboxFactory
from dockyard.sandboxes.images import ImageBuildError, expand_heredocs, logical_lines, rewrite_froms
from dockyard.sandboxes.podman import podman_path
from tests.conftest import REPO

TASKS = Path(__file__).parent / "image_tasks"
from tests.envs.conftest import BASE
needs_builder = pytest.mark.skipif(podman_path() is None or os.geteuid() != 0,
                                   reason="task images are built with podman as root (tools/install.sh)")


def test_docker_strips_comment_lines_inside_a_continued_instruction_and_reads_the_escape_directive():
    text = ("# escape=`\nFROM base\nRUN a && `\n    # not the end of RUN\n\n    b\n"
            "RUN c \\\n")
    assert [line for _, line in logical_lines(text)] == ["FROM base", "RUN a &&      b", "RUN c \\"]
    text = "FROM base\nRUN one \\\n  # comment\n  two \\\n  three\nENV A=1\n"
    assert [(n, line.split()[0]) for n, line in logical_lines(text)] == [(1, "FROM"), (2, "RUN"), (6, "ENV")]
    assert logical_lines(text)[1][1].split() == ["RUN", "one", "two", "three"]


def test_bases_are_mapped_to_local_images_stages_are_not_and_an_unknown_base_is_refused_by_line(tmp_path):
    dockerfile = tmp_path / "Dockerfile"
    text = ("ARG V=3.12\nFROM --platform=linux/amd64 python:${V}-slim AS build\nRUN make\n"
            "FROM build AS test\nFROM docker.io/library/ubuntu:24.04\nCOPY --from=build /x /x\n")
    local = {"localhost/base:1", "localhost/other"}.__contains__
    out, choices = rewrite_froms(text, dockerfile, {"ubuntu:24.04": "localhost/other"}, "localhost/base:1", local)
    assert [(c.asked, c.used, c.line) for c in choices] == [
        ("python:3.12-slim", "localhost/base:1", 2), ("docker.io/library/ubuntu:24.04", "localhost/other", 5)]
    assert out.splitlines()[1] == "FROM --platform=linux/amd64 localhost/base:1 AS build"
    assert out.splitlines()[3] == "FROM build AS test" and out.splitlines()[4] == "FROM localhost/other"
    with pytest.raises(ImageBuildError, match=r"Dockerfile:5: FROM docker.io/library/ubuntu:24.04: not in this "
                                              r"machine's image store and not mapped in env.sandbox.base_images"):
        rewrite_froms(text, dockerfile, {}, None, {"python:3.12-slim"}.__contains__)
    with pytest.raises(ImageBuildError, match="maps to localhost/gone, which is not in this machine's image store"):
        rewrite_froms("FROM alpine\n", dockerfile, {"alpine:latest": "localhost/gone"}, None, local)


def test_heredocs_become_plain_run_lines_that_any_builder_reads():
    text = "FROM b\nRUN <<EOT\necho one\necho two\nEOT\nCOPY <<EOF /etc/x.conf\nk=v\nEOF\nRUN python3 - <<'PY'\nprint(1)\nPY\n"
    out = expand_heredocs(text)
    assert "<<" not in out and "echo one" not in out   # bodies travel base64-encoded
    assert [line.split()[0] for _, line in logical_lines(out)] == ["FROM", "RUN", "RUN", "RUN"]
    assert "python3 - < /tmp/.dockyard-heredoc-0" in out


def test_the_host_mode_parser_reads_the_same_lines_as_docker():
    setup = parse_dockerfile(TASKS / "harbor-built" / "environment" / "Dockerfile", TASKS / "harbor-built" / "environment")
    assert setup.workdir == "/app" and setup.env["TOOLS"] == "/opt/tools"
    assert ("ledger.csv", "/data/") in [(s.name, t) for s, t in setup.copies] or \
        ("ledger.csv", "/data/ledger.csv") in [(s.name, t) for s, t in setup.copies]
    assert len(setup.run) == 5 and setup.run[0].split()[:3] == ["mkdir", "-p", "$TOOLS"]


def test_task_image_settings_are_refused_by_name_where_they_cannot_take_effect(tmp_path):
    with pytest.raises(SandboxError, match="env.sandbox.base_images: only task_images build reads it"):
        SandboxFactory(SandboxConfig(type="bubblewrap", base_images={"ubuntu:24.04": BASE}))
    with pytest.raises(SandboxError, match="env.sandbox.default_base_image: only task_images build reads it"):
        SandboxFactory(SandboxConfig(type="bubblewrap", default_base_image=BASE))
    with pytest.raises(SandboxError, match="env.sandbox.task_images: build runs task images in podman or bubblewrap "
                                           "sandboxes, not none"):
        SandboxFactory(SandboxConfig(type="none", trusted=True, task_images="build"))


def test_task_images_are_refused_for_an_environment_that_does_not_read_them():
    from dockyard.config.loader import load_config
    from dockyard.preflight.components import unsupported

    programs = load_config(REPO / "configs" / "grpo_program_bench_local.yaml", ["env.sandbox.task_images=build"]).config
    assert [p.path for p in unsupported(programs)] == ["env.sandbox.task_images"]
    swe = load_config(REPO / "configs" / "grpo_swe_local.yaml", ["env.sandbox.task_images=build"]).config
    assert unsupported(swe) == []    # each row's environment (swe_environments.py)
    terminal = load_config(REPO / "configs" / "grpo_terminal_bench_local.yaml",
                           ["env.sandbox.task_images=build", f"env.sandbox.default_base_image={BASE}"]).config
    assert unsupported(terminal) == []


@needs_builder
def test_a_cache_below_a_closed_folder_is_refused_for_bubblewrap(open_folder):
    closed = open_folder / "closed"
    closed.mkdir(mode=0o700)
    closed.chmod(0o700)
    with pytest.raises(SandboxError, match=f"env.sandbox.image_cache: .* is below {closed}, which the sandboxes' users "
                                           "cannot pass through"):
        SandboxFactory(SandboxConfig(type="bubblewrap", task_images="build", image_cache=str(closed / "cache")))


def _factory(kind: str, cache: Path) -> SandboxFactory:
    return SandboxFactory(SandboxConfig(type=kind, task_images="build", default_base_image=BASE,
                                        image_cache=str(cache), command_exec_timeout_s=60, max_concurrent=2))


@needs_builder
@pytest.mark.parametrize("kind", ["bubblewrap", "podman"])
def test_published_dockerfile_semantics_take_effect_and_the_oracle_passes_with_its_tests_run(kind, base_image,
                                                                                                open_folder):
    factory = _factory(kind, open_folder / "cache")   # shared by both kinds: one build per task
    for task in load_tasks(TASKS):
        image = factory.task_image(task.name, task.dockerfile, task.build_context)
        assert image.tag.startswith("localhost/dockyard-task:") and image.rootfs is not None   # both kinds run root on it
        # python:* on the base's Python flavour (`python`, a pip without PEP 668's marker), the rest on the base
        flavour = "-python" if task.setup.image.startswith("python:") else ""
        assert f"FROM {task.setup.image} built on {BASE}{flavour}" in image.notes, image.notes
        oracle = run_trial(task, factory.create, oracle_agent, image=image)
        assert oracle.error is None and oracle.reward == 1.0, (oracle.notes, oracle.test_output)
        assert "PASSED" in oracle.test_output and "failed" not in oracle.test_output   # the tests ran, all passed
        noop = run_trial(task, factory.create, lambda task, sandbox: "", image=image)
        assert noop.error is None and noop.reward == 0.0 and "FAILED" in noop.test_output, noop.test_output
    harbor = load_task(TASKS / "harbor-built")
    image = factory.task_image(harbor.name, harbor.dockerfile, harbor.build_context)
    assert not image.built_now and image.seconds < 5   # the second time it comes from the cache
    sandbox = factory.create(sandbox_spec(harbor, image))
    try:
        assert sandbox.workdir == "/app"
        shown = sandbox.run("echo $LEDGER_DIR; cat readme.txt; tally /data/ledger.csv; stat -c %U /home/alice/notes.txt; "
                            "whoami; grep -c '^alice:' /etc/passwd")
        lines = shown.output.split()
        assert lines[:6] == ["/data", "written", "in", "WORKDIR", "by", "RUN"] and lines[6] == "35.0"
        # the agent is root in the sandbox's own user namespace (test_root_inside.py), which maps all the
        # image's users: COPY --chown's owner reads as alice in both kinds
        assert lines[7] == "alice" and lines[8:] == ["root", "1"]
        assert sandbox.run("touch /opt/tools/made.txt").ok   # as in a container: root may change the image's files
    finally:
        sandbox.destroy()


@needs_builder
def test_a_changed_build_context_builds_anew_and_a_failing_run_line_names_its_step(base_image, tmp_path):
    task = tmp_path / "task"
    (task / "environment").mkdir(parents=True)
    (task / "environment" / "Dockerfile").write_text("FROM ubuntu:24.04\nCOPY v.txt /v.txt\n")
    nonce = secrets.token_hex(8)   # contents never built before on this machine
    (task / "environment" / "v.txt").write_text(f"{nonce} 1")
    factory = _factory("podman", tmp_path / "cache")
    first = factory.task_image("t", task / "environment" / "Dockerfile", task / "environment")
    (task / "environment" / "v.txt").write_text(f"{nonce} 2")
    second = factory.task_image("t", task / "environment" / "Dockerfile", task / "environment")
    assert first.built_now and second.built_now and first.tag != second.tag
    subprocess.run(["podman", "rmi", "-f", first.tag, second.tag], capture_output=True)   # one-off images
    (task / "environment" / "Dockerfile").write_text("FROM ubuntu:24.04\nRUN echo about to fail && false\n")
    with pytest.raises(ImageBuildError, match=r"task t: building .*Dockerfile failed: STEP 2/2: RUN echo about to fail "
                                              r"&& false .*whole log: .*build.log"):
        factory.task_image("t", task / "environment" / "Dockerfile", task / "environment")


def test_an_unreadable_task_is_a_bad_task_row_and_the_others_still_load(tmp_path):
    good = tmp_path / "good"
    (good / "tests").mkdir(parents=True)
    (good / "task.toml").write_text("[verifier]\ntimeout_sec = 10.0\n")
    (good / "instruction.md").write_text("Do nothing.\n")
    (good / "tests" / "test.sh").write_text("echo 1 > /logs/verifier/reward.txt\n")
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "task.toml").write_text("[verifier\ntimeout_sec = \n")
    problems: list[str] = []
    assert [t.name for t in load_tasks(tmp_path, problems)] == ["good"]
    assert len(problems) == 1 and problems[0].startswith("bad: ") and "not valid TOML" in problems[0]
    assert "\n" not in problems[0]
    with pytest.raises(Exception, match="not valid TOML"):
        load_tasks(tmp_path)


def test_env_check_reports_a_bad_task_and_runs_the_others(tmp_path):
    shutil.copytree(REPO / "tasks" / "terminal_bench" / "echo-hello", tmp_path / "echo-hello")
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "task.yaml").write_text("instruction: [unclosed\n")
    result = subprocess.run([sys.executable, "-m", "dockyard.cli", "env", "check", "--config",
                             "grpo_terminal_bench_local.yaml", "--tasks", str(tmp_path), "--agent", "oracle"],
                            capture_output=True, text=True, timeout=600, cwd=REPO)
    lines = result.stdout.splitlines()
    assert result.returncode == 1, result.stdout + result.stderr
    assert any(line.startswith("BAD TASK broken: ") and "not valid YAML" in line for line in lines), result.stdout
    assert any(line.startswith("echo-hello") and " 1.00 " in line for line in lines), result.stdout


TB1_RUN_TESTS = """#!/bin/bash
# Terminal-Bench 1's standard run-tests.sh: uv and pytest fetched at test time
apt-get update
apt-get install -y curl
curl -LsSf https://astral.sh/uv/0.7.13/install.sh | sh
source $HOME/.local/bin/env
uv venv .tbench-testing
source .tbench-testing/bin/activate
uv pip install pytest==8.4.1
uv run pytest $TEST_DIR/test_outputs.py -rA
"""


def test_env_check_says_when_the_tests_never_ran_and_quotes_why(tmp_path):
    task = tmp_path / "tasks" / "needs-uv"
    shutil.copytree(REPO / "tasks" / "terminal_bench" / "echo-hello", task)
    (task / "run-tests.sh").write_text(TB1_RUN_TESTS)
    result = subprocess.run([sys.executable, "-m", "dockyard.cli", "env", "check", "--config",
                             "grpo_terminal_bench_local.yaml", "--tasks", str(task.parent), "--agent", "oracle",
                             "--logs", str(tmp_path / "logs")], capture_output=True, text=True, timeout=600, cwd=REPO)
    assert result.returncode == 1, result.stdout + result.stderr
    row = next(line for line in result.stdout.splitlines() if line.startswith("needs-uv "))
    assert row.split()[1:3] == ["0.00", "no"]   # reward, tests ran
    assert "no pytest record: the test harness's output says" in row and "resolve host" in row
    assert len(row) < 260
    assert "BROKEN needs-uv [network needed]" in result.stdout
    log = (tmp_path / "logs" / "needs-uv.log").read_text()
    assert "uv: command not found" in log and "tests ran: no" in log


@needs_builder
def test_env_build_builds_ahead_of_a_run_and_then_finds_everything_cached(base_image, open_folder):
    def build():
        return subprocess.run([sys.executable, "-m", "dockyard.cli", "env", "build", "--config",
                               "grpo_terminal_bench_local.yaml", "--tasks", str(TASKS), "env.sandbox.task_images=build",
                               f"env.sandbox.default_base_image={BASE}", f"env.sandbox.image_cache={open_folder}/cache"],
                              capture_output=True, text=True, timeout=900, cwd=REPO)

    first = build()
    assert first.returncode == 0, first.stdout + first.stderr
    second = build()
    assert second.returncode == 0 and "2 tasks: 0 built, 2 cached" in second.stdout, second.stdout
    assert [line.split(": ")[1].split()[0] for line in second.stdout.splitlines() if line.startswith("[")] == \
        ["cached", "cached"]
    host = subprocess.run([sys.executable, "-m", "dockyard.cli", "env", "build", "--config",
                           "grpo_terminal_bench_local.yaml", "--tasks", str(TASKS)],
                          capture_output=True, text=True, timeout=300, cwd=REPO)
    assert host.returncode == 2 and "env.sandbox.task_images is host (nothing to build)" in host.stderr
    check = subprocess.run([sys.executable, "-m", "dockyard.cli", "env", "check", "--config",
                            "grpo_terminal_bench_local.yaml", "--tasks", str(TASKS), "--rebuild", "--logs",
                            str(open_folder / "logs")], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert check.returncode == 2 and "--rebuild needs env.sandbox.task_images: build" in check.stderr
    assert not (open_folder / "logs").exists()   # refused before any task ran


def _verifier_network_task(where: Path) -> Path:
    """A Harbor task whose tests install a package from PyPI (as published test scripts do) and whose
    solution checks that the agent itself has no network."""
    task = where / "verifier-network"
    (task / "tests").mkdir(parents=True)
    (task / "solution").mkdir()
    (task / "task.toml").write_text("[verifier]\ntimeout_sec = 300.0\n[agent]\ntimeout_sec = 60.0\n"
                                    "[environment]\nallow_internet = false\n")
    (task / "instruction.md").write_text("Write done to /app/done.txt.\n")
    (task / "environment").mkdir()
    (task / "environment" / "Dockerfile").write_text("FROM ubuntu:24.04\nWORKDIR /app\n")
    (task / "solution" / "solve.sh").write_text(
        "echo done > /app/done.txt\n"
        "python3 -c \"import urllib.request; urllib.request.urlopen('https://pypi.org/simple/six/', timeout=5)\" "
        "&& echo online > /app/agent-network.txt || true\n")
    (task / "tests" / "test.sh").write_text(
        "if [ -f /app/agent-network.txt ]; then echo 0 > /logs/verifier/reward.txt; exit 0; fi\n"
        "python3 -m venv /tests/venv && /tests/venv/bin/pip install --quiet six==1.16.0 "
        "&& /tests/venv/bin/python -c 'import six' && [ -f /app/done.txt ] "
        "&& echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt\n")
    return task


@needs_builder
@pytest.mark.parametrize("kind", ["bubblewrap", "podman"])
def test_the_verifier_gets_the_network_only_when_the_config_says_and_the_agent_never(kind, tmp_path):
    task = load_task(_verifier_network_task(tmp_path))
    factory = SandboxFactory(SandboxConfig(type=kind, command_exec_timeout_s=300))
    offline = run_trial(task, factory.create, oracle_agent)
    assert offline.reward == 0.0 and offline.tests_ran == "reward file", offline.test_output[-600:]
    online = run_trial(task, factory.create, oracle_agent, policy=NetworkPolicy(verifier=True))
    assert online.error is None and online.reward == 1.0, (online.notes, online.test_output[-800:])
    fresh = [note for note in online.notes if note.startswith("the tests ran in a fresh sandbox with the network")]
    assert bool(fresh) == (kind == "podman")   # bubblewrap gives the agent's own sandbox a network at the hand-over
    task.metadata["environment"]["allow_internet"] = True   # the check above is live: an agent online scores 0
    assert run_trial(task, factory.create, oracle_agent, policy=NetworkPolicy(verifier=True)).reward == 0.0


def test_a_terminal_bench_compose_file_gives_the_main_service_and_its_sidecars(tmp_path):
    tb1 = load_task(TASKS / "tb1-built")   # Terminal-Bench 1's standard compose file, plus one variable
    assert tb1.setup.env["TEST_DIR"] == "/tests" and tb1.setup.env["LOW_MARK"] == "5"
    assert tb1.dockerfile == TASKS / "tb1-built" / "Dockerfile"
    assert [line for line in tb1.setup.ignored if "compose" in line] == []   # image, command...: harness plumbing
    task = tmp_path / "two-services"
    shutil.copytree(TASKS / "tb1-built", task)
    (task / "docker-compose.yaml").write_text(
        "services:\n  client:\n    build:\n      dockerfile: Dockerfile\n    working_dir: /srv\n"
        "  db:\n    image: postgres:16\n")
    problems: list[str] = []
    [loaded] = load_tasks(tmp_path, problems)
    assert problems == [] and loaded.setup.workdir == "/srv"
    assert [(s.name, s.image) for s in loaded.sidecars] == [("db", "postgres:16")]   # run beside it (podman)
    (task / "docker-compose.yaml").write_text(
        "services:\n  client:\n    build: .\n    working_dir: /srv\n    volumes:\n      - ./data:/data\n")
    with pytest.raises(TaskFormatError, match="mounts './data:/data': volumes beside Terminal-Bench's log folders"):
        load_task(task)
    (task / "docker-compose.yaml").write_text("services:\n  client:\n    build: .\n    working_dir: /srv\n")
    assert load_task(task).setup.workdir == "/srv"


@needs_builder
def test_an_agent_episode_runs_on_the_built_image_and_its_tests_decide(base_image, open_folder):
    """The path a training run takes (TerminalBenchEnvironment.open / execute / finish), on task images."""
    from dockyard.agents.tool_format import Action
    from dockyard.config.schema.env import EnvConfig
    from dockyard.data.datasets import Prompt
    from dockyard.envs.terminal_bench import TerminalBenchEnvironment

    env = TerminalBenchEnvironment(EnvConfig(name="terminal_bench", agent="tool_calling", sandbox=SandboxConfig(
        type="bubblewrap", task_images="build", default_base_image=BASE, image_cache=str(open_folder / "cache"))))
    prompt = Prompt("total the ledger", None, {"path": str(TASKS / "harbor-built")}, "t")
    episode = env.open(prompt)
    try:
        seen = episode.execute(Action("tool", "bash", {"command": "pwd; tally /data/ledger.csv > total.txt; echo $?"}))
        assert seen.split()[:2] == ["/app", "0"], seen
        assert any(note.startswith("FROM python:3.12-slim built on") for note in episode.notes)
        assert episode.finish() == 1.0
    finally:
        episode.close()
    wrong = env.open(prompt)   # the image is built once per task and environment
    try:
        wrong.execute(Action("tool", "bash", {"command": "echo 1 > /app/total.txt"}))
        assert wrong.finish() == 0.0
    finally:
        wrong.close()
    assert list(env._images) == [(TASKS / "harbor-built").resolve()]
