"""Terminal tasks in both published layouts, their trials in a real bubblewrap sandbox, and
`dockyard env check` on the shipped task set."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dockyard.config.schema.env import SandboxConfig
from dockyard.envs.terminal_tasks import TaskFormatError, load_task, load_tasks, parse_dockerfile
from dockyard.envs.grading import PytestRecord, pytest_grade
from dockyard.envs.terminal_trial import noop_agent, oracle_agent, run_trial, sandbox_spec
from dockyard.sandboxes.bubblewrap import bwrap_path
from dockyard.sandboxes.factory import SandboxFactory
from dockyard.sandboxes.podman import podman_path
from tests.conftest import REPO

SHIPPED = REPO / "tasks" / "terminal_bench"
needs_bwrap = pytest.mark.skipif(bwrap_path() is None, reason="bubblewrap is not installed (tools/install.sh)")
needs_podman = pytest.mark.skipif(podman_path() is None, reason="podman is not installed (tools/install.sh)")


@pytest.fixture
def factory():
    return SandboxFactory(SandboxConfig(type="bubblewrap", command_exec_timeout_s=30, max_concurrent=4))


def test_both_layouts_load_from_the_shipped_set():
    tasks = {task.name: task for task in load_tasks(SHIPPED)}
    assert len(tasks) >= 18 and {t.layout for t in tasks.values()} == {"terminal-bench", "harbor"}
    tb1 = tasks["count-lines"]
    assert tb1.instruction.startswith("Count the lines of data.txt")
    assert (tb1.agent_timeout_s, tb1.test_timeout_s) == (180.0, 60.0)
    assert tb1.setup.workdir == "/app" and tb1.setup.copies == [(SHIPPED / "count-lines" / "files", "/app")]
    assert tb1.test_command == "bash /tests/run-tests.sh"
    assert ("/tests/run-tests.sh", "/tests/test_outputs.py") == tuple(t for _, t in tb1.tests)
    harbor = tasks["word-frequency"]
    assert harbor.layout == "harbor" and harbor.test_command == "bash /tests/test.sh"
    assert harbor.setup.copies == [(SHIPPED / "word-frequency" / "environment" / "story.txt", "/app/story.txt")]
    assert harbor.solution == SHIPPED / "word-frequency" / "solution" / "solve.sh"
    assert harbor.metadata["environment"]["allow_internet"] is False
    assert sandbox_spec(harbor).network is False and sandbox_spec(tb1).network is False
    harbor.metadata["environment"]["allow_internet"] = True   # a Harbor task may ask for the network
    assert sandbox_spec(harbor).network is True


def test_dockerfile_lines_a_sandbox_honours(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.py").write_text("")
    (tmp_path / "b.txt").write_text("")
    (tmp_path / "Dockerfile").write_text(
        "FROM python:3.13\n# a comment\nWORKDIR /srv\nWORKDIR app\nENV A=1 B=\"two words\"\nENV LEGACY value with spaces\n"
        "COPY src/ ./code/\nCOPY [\"b.txt\", \"/data/\"]\nADD b.txt renamed.txt\nRUN apt-get update && \\\n    apt-get install -y jq\n"
        "COPY --from=builder /x /y\nCMD [\"bash\"]\n")
    setup = parse_dockerfile(tmp_path / "Dockerfile", tmp_path)
    assert setup.image == "python:3.13" and setup.workdir == "/srv/app"
    assert setup.env == {"A": "1", "B": "two words", "LEGACY": "value with spaces"}
    assert setup.copies == [(tmp_path / "src", "/srv/app/code"), (tmp_path / "b.txt", "/data/b.txt"),
                            (tmp_path / "b.txt", "/srv/app/renamed.txt")]
    assert setup.run == ["apt-get update &&      apt-get install -y jq"]   # as Docker joins it: indentation kept
    assert [line.split()[0] for line in setup.ignored] == ["COPY", "CMD"]
    # `$PATH` in an ENV line is the image's PATH (the standard one every sandbox starts with), not a literal
    (tmp_path / "Dockerfile").write_text("FROM x\nENV PATH=/opt/tool/bin:$PATH\nENV OTHER=${PATH}:/x\n")
    env = parse_dockerfile(tmp_path / "Dockerfile", tmp_path).env
    assert env["PATH"] == "/opt/tool/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    assert env["OTHER"] == env["PATH"] + ":/x"
    (tmp_path / "Dockerfile").write_text("FROM x\nCOPY missing.txt /a\n")
    with pytest.raises(TaskFormatError, match="Dockerfile: COPY source 'missing.txt' does not exist"):
        parse_dockerfile(tmp_path / "Dockerfile", tmp_path)
    (tmp_path / "Dockerfile").write_text("FROM x\nFROBNICATE y\n")
    with pytest.raises(TaskFormatError, match="unknown Dockerfile instruction 'FROBNICATE'"):
        parse_dockerfile(tmp_path / "Dockerfile", tmp_path)


def test_broken_task_folders_and_indexes_are_named(tmp_path):
    task = tmp_path / "t1"
    shutil.copytree(SHIPPED / "hello-file", task)
    (task / "task.yaml").write_text("difficulty: easy\n")
    with pytest.raises(TaskFormatError, match=r"t1/task.yaml: `instruction` is required"):
        load_task(task)
    (task / "task.yaml").write_text("instruction: [unclosed\n")
    with pytest.raises(TaskFormatError, match="t1/task.yaml: not valid YAML"):
        load_task(task)
    with pytest.raises(TaskFormatError, match="neither task.yaml"):
        load_task(tmp_path)
    index = tmp_path / "tasks.jsonl"
    index.write_text(json.dumps({"path": str(SHIPPED / "hello-file"), "instruction": "Say hello in hello.txt."})
                     + "\n{broken\n")
    with pytest.raises(TaskFormatError, match=r"tasks.jsonl:2: not valid JSON"):
        load_tasks(index)
    index.write_text(json.dumps({"path": str(SHIPPED / "hello-file"), "instruction": "Say hello in hello.txt."}) + "\n")
    [loaded] = load_tasks(index)
    assert loaded.name == "hello-file" and loaded.instruction == "Say hello in hello.txt."


def test_pytests_own_record_decides_terminal_bench_tasks_never_its_printed_summary():
    def grade(*records, printed=False):
        return pytest_grade(list(records), [], printed, ["/app", "/tmp"], ["/tests"])

    passed = PytestRecord(0, {"t.py::a": "passed", "t.py::b": "xfailed"}, ["/usr/lib/python3/dist-packages/_pytest/main.py"])
    assert grade(passed) == (True, "2 tests passed (pytest's record)", None)
    assert grade(PytestRecord(1, {"t.py::a": "passed", "t.py::b": "failed"}, []))[:2] == (False, "1 of 2 tests failed: t.py::b")
    assert grade(PytestRecord(2, {"t.py": "error"}, []))[0] is False
    assert grade(PytestRecord(5, {}, [])) == (False, "pytest ran no test", None)
    # a summary on stdout with no session behind it (a fake pytest printed it): no pay, and it is a verifier error
    resolved, _, error = grade(printed=True)
    assert not resolved and "the output shows pytest results: they are not trusted" in error
    assert grade() == (False, "pytest wrote no record (the tests did not run pytest to its end)", None)
    # what pytest decided and how it exited must agree
    assert "exited 0 but its record has failures" in grade(PytestRecord(0, {"t.py::a": "failed"}, []))[2]
    assert "exited 1 (tests failed) but its record has no failure" in grade(PytestRecord(1, {"t.py::a": "passed"}, []))[2]
    # a conftest.py or plugin from where the agent could write, or a conftest outside the task's tests
    for plugin in ("/app/conftest.py", "/tmp/evil_plugin.py", "/srv/conftest.py"):
        resolved, _, error = grade(PytestRecord(0, {"t.py::a": "passed"}, [plugin]))
        assert not resolved and plugin in error
    assert grade(PytestRecord(0, {"t.py::a": "passed"}, ["/tests/conftest.py"]))[0] is True
    # a configuration file pytest read from the workspace (its addopts, its plugins) is as foreign
    assert "/app/pytest.ini" in grade(PytestRecord(0, {"t.py::a": "passed"}, [], "/app/pytest.ini"))[2]
    # unless it is the task's own file, left as the task placed it
    own = PytestRecord(0, {"t.py::a": "passed"}, ["/app/conftest.py"], "/app/pytest.ini")
    assert pytest_grade([own], [], False, ["/app"], ["/tests"], lambda path: path.startswith("/app/"))[0] is True


@needs_bwrap
def test_oracle_solves_and_noop_fails_a_task_of_each_layout(factory):
    for name in ("sum-column", "git-commit", "csv-to-json", "word-frequency"):
        task = load_task(SHIPPED / name)
        solved = run_trial(task, factory.create, oracle_agent)
        assert solved.error is None and solved.reward == 1.0, solved.test_output
        untouched = run_trial(task, factory.create, noop_agent)
        assert untouched.error is None and untouched.reward == 0.0, untouched.test_output
    partial = run_trial(load_task(SHIPPED / "csv-to-json"), factory.create,
                        lambda task, box: box.run("echo '[{\"name\": \"Ada\"}]' > people.json").output)
    assert partial.reward == pytest.approx(1 / 3)   # Harbor's reward.json: partial credit


@needs_bwrap
def test_an_agent_cannot_plant_a_reward_or_see_the_tests(factory):
    task = load_task(SHIPPED / "word-frequency")

    def cheat(task, box):
        seen = box.run("ls /tests /solution; mkdir -p /logs/verifier; echo 1 > /logs/verifier/reward.txt; "
                       "echo 1 > reward.txt").output
        assert "No such file or directory" in seen and "Read-only file system" in seen
        return seen

    result = run_trial(task, factory.create, cheat)
    assert result.reward == 0.0 and result.error is None
    assert "base image ubuntu:24.04 not used (env.sandbox.task_images: host): the bubblewrap sandbox runs commands on this " \
           "machine's /usr and /etc, read-only" in result.notes


@needs_bwrap
@needs_podman
def test_run_lines_take_effect_in_podman_and_are_reported_skipped_in_bubblewrap(tmp_path):
    task_dir = tmp_path / "configured"
    shutil.copytree(SHIPPED / "replace-text", task_dir)
    dockerfile = task_dir / "Dockerfile"
    dockerfile.write_text(dockerfile.read_text().replace("COPY files/ /app/", "RUN mkdir -p /app && printf "
                          "'[server]\\nhost = localhost\\nport = 8080\\ndebug = false\\n' > /app/config.ini"))
    task = load_task(task_dir)
    assert task.setup.copies == [] and len(task.setup.run) == 1
    podman = SandboxFactory(SandboxConfig(type="podman", command_exec_timeout_s=30))
    built = run_trial(task, podman.create, oracle_agent)
    assert built.reward == 1.0 and built.error is None, built.test_output
    assert not any("RUN line" in note for note in built.notes)
    skipped = run_trial(task, SandboxFactory(SandboxConfig(type="bubblewrap")).create, oracle_agent)
    assert skipped.reward == 0.0
    assert any("1 RUN line(s)" in note and "skipped" in note for note in skipped.notes)


@needs_bwrap
def test_env_check_passes_the_shipped_set_and_names_a_broken_task(tmp_path):
    def check(agent, tasks):
        return subprocess.run([sys.executable, "-m", "dockyard.cli", "env", "check", "--config", "grpo_terminal_bench.yaml",
                               "--tasks", str(tasks), "--agent", agent, "env.sandbox.type=bubblewrap",
                               "env.sandbox.image=null", "env.num_workers=2"],
                              capture_output=True, text=True, timeout=600, cwd=REPO)

    for agent, mean in (("oracle", "1.00"), ("noop", "0.00")):
        result = check(agent, SHIPPED)
        assert result.returncode == 0, result.stdout + result.stderr
        assert f"mean reward {mean} over" in result.stdout and "BROKEN" not in result.stdout
    broken = tmp_path / "tasks"
    shutil.copytree(SHIPPED / "hello-file", broken / "always-passes")
    (broken / "always-passes" / "tests" / "test_outputs.py").write_text("def test_nothing():\n    assert True\n")
    result = check("noop", broken)
    assert result.returncode == 1
    assert "BROKEN always-passes [tests pass without work]: the noop agent got reward 1.00, expected 0" in result.stdout
    result = check("oracle", tmp_path / "nowhere")
    assert result.returncode == 2 and "no such task folder" in result.stderr and "Traceback" not in result.stderr


@needs_podman
def test_env_check_in_podman_passes_the_shipped_set():
    """Every shipped task scores 1 with its oracle and 0 with the no-op in podman too (the grader's
    guards took nothing from an honest solution)."""
    count = len(load_tasks(SHIPPED))
    for agent, mean in (("oracle", "1.00"), ("noop", "0.00")):
        result = subprocess.run([sys.executable, "-m", "dockyard.cli", "env", "check", "--config",
                                 "grpo_terminal_bench_local.yaml", "--tasks", str(SHIPPED), "--agent", agent,
                                 "env.sandbox.type=podman", "env.num_workers=2"],
                                capture_output=True, text=True, timeout=900, cwd=REPO)
        assert result.returncode == 0, result.stdout + result.stderr
        assert f"mean reward {mean} over {count} tasks" in result.stdout and "sandbox podman" in result.stdout
        assert "BROKEN" not in result.stdout and "verifier error" not in result.stdout, result.stdout


@needs_bwrap
def test_an_agents_escape_attempts_are_contained_and_recorded_in_the_episode(tmp_path):
    """The environment side of an episode, driven with the actions a misbehaving agent would send:
    each attempt fails inside the sandbox, the next one still runs, and every one is in the record."""
    from dockyard.agents.tool_format import Action
    from dockyard.config.schema.env import EnvConfig
    from dockyard.data.datasets import Prompt
    from dockyard.envs.terminal_bench import TerminalBenchEnvironment

    env = TerminalBenchEnvironment(EnvConfig(name="terminal_bench", agent="tool_calling", sandbox=SandboxConfig(
        type="bubblewrap", command_exec_timeout_s=30, memory_mb=256, max_processes=64, file_size_mb=8)))
    episode = env.open(Prompt("Create hello.txt", None, {"path": str(SHIPPED / "hello-file")}, "t"))
    secret = Path.home() / ".dockyard-episode-secret"
    secret.write_text("host secret")
    attempts = {
        "network": "python3 -c 'import socket; socket.create_connection((\"1.1.1.1\", 80), timeout=3)'",
        "write outside": "echo owned > /etc/dockyard-owned",
        "host home": f"cat {secret}",
        "tests early": "ls /tests /solution",
        "memory": "python3 -c 'x = bytearray(600 * 1024 * 1024)'",
        "huge file": "head -c 50000000 /dev/zero > big.bin; stat -c %s big.bin",
        "outlive the timeout": "sleep 300",
        # last: its processes outlive the command and hold the process limit until the shell gives up, so
        # the command after it may find no process to fork (how soon depends on the machine's load)
        "fork bomb": "bomb() { bomb | bomb & }; bomb",
    }
    try:
        # generous timeouts (a busy machine), but the sleep's is what it must outlive
        observations = {name: episode.execute(Action("tool", "bash", {
            "command": command, "timeout": 3 if name == "outlive the timeout" else 30})) for name, command in attempts.items()}
    finally:
        secret.unlink()
    assert "Network is unreachable" in observations["network"]
    assert "Read-only file system" in observations["write outside"] and not Path("/etc/dockyard-owned").exists()
    assert "host secret" not in observations["host home"] and "No such file" in observations["host home"]
    assert observations["tests early"].count("No such file or directory") == 2
    assert "MemoryError" in observations["memory"]
    assert "8388608" in observations["huge file"]
    assert observations["outlive the timeout"].endswith("[timed out]")
    assert [event["command"] for event in episode.events] == list(attempts.values())
    assert [event["timed_out"] for event in episode.events][-2] is True
    # the run goes on: the command right after the bomb may find the process limit spent (its shell exits),
    # but the next one gets a new shell, started once the old one's processes are gone
    afters = [episode.execute(Action("tool", "bash", {"command": "/bin/echo still here", "timeout": 60}))]
    if "still here" not in afters[0].splitlines():
        assert "[the shell exited]" in afters[0], afters
        afters.append(episode.execute(Action("tool", "bash", {"command": "/bin/echo still here", "timeout": 60})))
    assert "still here" in afters[-1].splitlines(), afters
    print(f"{len(afters)} command(s) after the bomb")
    assert episode.finish() == 0.0 and "tests" in episode.events[-1]
    episode.close()
