"""One trial of a terminal task: a sandbox built from the task, an agent at work in it, then the
task's own tests, which decide the reward.

The order matters for honesty (grading.py has the rest): the sandbox is handed over first (the
agent's shells closed, every process it started gone for certain, the workspace the verifier's
user's); the tests are copied only then, into /tests (then the verifier's to write, as published test
scripts expect; only the task's own files there count as pytest plugins or conftests), with a fresh
/logs/verifier of the verifier's, and they run in the verifier's environment, with what the agent left
that would steer uv (its project, its .venv, an interpreter pin) turned off and its Python start-up
hooks unreadable (hand_over.py); the grade is read once every process they started is gone, and a plugin
pytest loaded from the agent's folders counts as the verifier's only if the tests made it there after
the hand-over (a harness's own environment). With `grading: fresh_sandbox` (an extra key of
terminal_bench) the tests run in a
new sandbox built from the task that receives only the agent's workspace. The oracle agent alone gets
the task's solution, in /solution, read-only.
"""

from __future__ import annotations

import re
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

import yaml

from dockyard.envs.grading import (FOREIGN, Grade, copied_unchanged, declares_pytest_plugin, foreign_plugins, harness_failure, new_plugin_name, pytest_grade, read_records,
                                   reward_file,
                                   shadowing_files, task_placed, unchanged_check, verifier_env, verifier_files)
from dockyard.envs import hand_over
from dockyard.envs.system_integrity import harness_view
from dockyard.envs.terminal_tasks import TerminalTask
from dockyard.sandboxes.base import Sandbox, SandboxError, SandboxSpec, ServiceSpec
from dockyard.sandboxes.images import TaskImage

_PYTEST_RESULT = re.compile(r"^(PASSED|FAILED|ERROR|XPASS|XFAIL|SKIPPED)\s+(\S+)", re.MULTILINE)
GRADINGS = ("same_sandbox", "fresh_sandbox")


@dataclass
class TrialResult:
    task: str
    reward: float
    seconds: float
    agent_output: str = ""
    test_output: str = ""
    notes: list[str] = field(default_factory=list)
    error: str | None = None
    verifier_error: str | None = None
    suspicious: list[str] = field(default_factory=list)
    tests_ran: str | None = None     # Grade.tests_ran, where the environment's tests are a harness that may not run

    @property
    def resolved(self) -> bool:
        return self.reward >= 1.0


@dataclass(frozen=True)
class NetworkPolicy:
    """Who gets the network: the agent where the task allows it (Harbor's `allow_internet`; a layout
    without that field, as Terminal-Bench 1's, takes `agent_default`), the tests where `verifier` says."""

    agent_default: bool = False
    verifier: bool = False

    def agent(self, task: TerminalTask) -> bool:
        return bool(task.metadata.get("environment", {}).get("allow_internet", self.agent_default))


def sandbox_spec(task: TerminalTask, image: TaskImage | None = None, policy: NetworkPolicy = NetworkPolicy()
                 ) -> SandboxSpec:
    """The task's sandbox: on its built image (env.sandbox.task_images: build), else the Dockerfile as
    far as a sandbox without an image builder honours it."""
    network, verifier_network = policy.agent(task), policy.verifier
    if image is not None:   # WORKDIR / (Docker's default) cannot be a workspace: the configured one serves
        workdir = task.setup.run_workdir or image.workdir
        built = {name: (service.tag, service.env) for name, service in image.services.items()}
        services = [ServiceSpec(s.name, built.get(s.name, ("", {}))[0], {**built.get(s.name, ("", {}))[1], **s.env},
                                s.command, s.working_dir, s.health) for s in task.sidecars]
        return SandboxSpec(workdir="" if workdir == "/" else workdir, env={**image.env, **task.setup.run_env},
                           name=f"task {task.name}", network=network, verifier_network=verifier_network,
                           image=image.tag, rootfs=image.rootfs, services=services)
    if task.sidecars:
        raise SandboxError(f"task {task.name}: its docker-compose services beside the main one "
                           f"({', '.join(s.name for s in task.sidecars)}) run on built images only "
                           "(env.sandbox.task_images: build, in podman), and the main service needs a Dockerfile")
    return SandboxSpec(workdir=task.setup.workdir or "", files=list(task.setup.copies), env=dict(task.setup.env),
                       name=f"task {task.name}", run=list(task.setup.run), network=network,
                       verifier_network=verifier_network)


def grading_sandbox(task: TerminalTask, used: Sandbox, make_sandbox: Callable[[SandboxSpec], Sandbox],
                    grading: str, notes: list[str]) -> Sandbox:
    """Where the tests run: the agent's sandbox, or a fresh one (`grading: fresh_sandbox`, or a verifier
    network that the agent's sandbox cannot be given at the hand-over: a container's network is fixed
    when it starts)."""
    needs_network = used.spec.verifier_network and not used.spec.network and not used.network_at_hand_over
    if grading == "fresh_sandbox" or needs_network:
        if needs_network and grading != "fresh_sandbox":
            notes.append(f"the tests ran in a fresh sandbox with the network (env.verifier_allow_internet): a "
                         f"{used.kind} sandbox's network is fixed when it starts")
        spec = replace(used.spec, network=True) if used.spec.verifier_network else used.spec
        return regrade_sandbox(task, used, lambda _: make_sandbox(spec))
    return used


def setup_notes(task: TerminalTask, sandbox: Sandbox, image: TaskImage | None = None) -> list[str]:
    if image is not None:
        notes = list(image.notes) + [f"service {name} beside it: {'; '.join(service.notes)}"
                                     for name, service in image.services.items()]
        if (task.setup.run_workdir or image.workdir) == "/":
            notes.append(f"the image's WORKDIR is / (none set): the shell starts in {sandbox.workdir} "
                         "(env.sandbox.working_dir)")
        return notes
    notes = []
    if task.setup.image:
        image_name = getattr(sandbox, "image", None)
        root = (f"env.sandbox.image {image_name!r}" if image_name else "this machine itself" if sandbox.kind == "none"
                else "this machine's /usr and /etc, read-only")
        notes.append(f"base image {task.setup.image} not used (env.sandbox.task_images: host): the {sandbox.kind} "
                     f"sandbox runs commands on {root}")
    if task.setup.run and not sandbox.builds_images:
        notes.append(f"{len(task.setup.run)} RUN line(s) of {task.dockerfile} skipped: set env.sandbox.task_images: "
                     "build to build the task's image")
    if task.setup.ignored:
        notes.append(f"{len(task.setup.ignored)} Dockerfile line(s) without effect here: "
                     + "; ".join(line.split()[0] for line in task.setup.ignored))
    return notes


def regrade_sandbox(task: TerminalTask, used: Sandbox, make_sandbox: Callable[[SandboxSpec], Sandbox]) -> Sandbox:
    """`grading: fresh_sandbox`: a new sandbox from the task that receives only the agent's workspace
    (its links kept as links); the agent's sandbox is destroyed first (its slot frees the new one's)."""
    used.hand_over()
    with tempfile.TemporaryDirectory() as keep:
        used.copy_out(used.workdir, Path(keep) / "workspace", links=True)
        used.destroy()
        fresh = make_sandbox(used.spec)
        try:
            fresh.hand_over()
            fresh.place([(Path(keep) / "workspace", fresh.workdir, False)])
        except BaseException:
            fresh.destroy()
            raise
    return fresh


def system_for_tests(sandbox: Sandbox, suspicious: list[str]) -> tuple[Callable[[str], bool], list[str]]:
    """With root inside: the tests' tools get their image version back and what would stand in for them
    is left out (system_integrity.py); then which paths the agent wrote, and the notes. Without: nothing
    outside the agent's folders was the agent's."""
    changes = sandbox.system_changes()
    if changes is None:
        return (lambda path: False), []
    view = harness_view(changes, changes.image_has, lambda path: declares_pytest_plugin(str(changes.agent_file(path))))
    sandbox.revert_system(view.reverted())
    suspicious.extend(view.suspicious)
    after = sandbox.system_changes()
    return after.wrote, view.notes


def verify(task: TerminalTask, sandbox: Sandbox) -> Grade:
    """The task's tests on what the agent left in `sandbox` (handed over to the verifier here)."""
    sandbox.hand_over()
    placed = task_placed(task.setup.copies)
    suspicious = shadowing_files(sandbox, placed)
    unchanged = unchanged_check(sandbox, placed)
    wrote, system_notes = system_for_tests(sandbox, suspicious)
    left = hand_over.take(sandbox, unchanged, wrote)   # before the tests: what they make later is the verifier's
    plugin = new_plugin_name()
    env, notes = verifier_env(sandbox, dict(sandbox.spec.env), ["/tests"], safe_path=True, plugin_autoload=True,
                              plugin=plugin)
    notes = system_notes + notes
    if left.project:   # uv looks for a project from the verifier's empty HOME instead
        env["UV_PROJECT"] = env["HOME"]
        notes.append(f"uv ran the tests without the project of {left.project} (the agent made or changed it): "
                     "its environment and programs are the agent's")
    disabled = hand_over.disable_start_hooks(left)
    if disabled:
        notes.append(f"start-up hooks the agent left were made unreadable for the tests (Python would run them in "
                     f"any interpreter whose path holds them): {', '.join(disabled[:5])}")
    if left.environment:   # a fresh one of the verifier's
        env["UV_PROJECT_ENVIRONMENT"] = f"{env['HOME']}/project-environment"
        notes.append(f"uv kept the tests' project environment in {env['UV_PROJECT_ENVIRONMENT']}, not in "
                     f"{left.environment} (the agent made or changed it)")
    if left.interpreter_pin:   # the first python3 on the tests' PATH (the image's), unless a harness names one
        env["UV_PYTHON"] = "python3"
        notes.append(f"uv took python3 from the tests' PATH, not the interpreter {left.interpreter_pin} names (the agent "
                     "made or changed it)")
    env.update(sandbox.network_env())   # this machine's proxies and CA bundle, where the tests have a network
    with tempfile.TemporaryDirectory() as scratch:
        sandbox.place([(source, target, True) for source, target in task.tests] + verifier_files(Path(scratch), plugin))
    sandbox.open_to_verifier("/tests")   # published test scripts write there (`uv venv`, score files)
    result = sandbox.run(task.test_command, timeout_s=task.test_timeout_s, env={**env, "TEST_DIR": "/tests"},
                         replace_env=True)
    sandbox.end_processes()   # whatever the tests started is gone before anything is read
    output = result.output
    if result.timed_out:
        return Grade(0.0, output + f"\n[tests timed out after {task.test_timeout_s:.0f} s]", None, suspicious, notes)
    records, problems = read_records(sandbox)
    tests_ran = "pytest" if records else "no"
    # /tests was the verifier's to write: a plugin, conftest.py or configuration file pytest used from
    # there counts only if it is one of the task's own test files, as copied
    own_tests = copied_unchanged(sandbox, task_placed(task.tests))
    writable = [*sandbox.agent_writable(), "/tests"]

    def trusted(path: str) -> bool:
        return unchanged(path) or own_tests(path)
    if task.layout == "harbor":
        reward, why, error = reward_file(sandbox, *task.reward_range)
        if not records and not why.startswith("the tests wrote no"):
            tests_ran = "reward file"
        foreign = foreign_plugins(records, writable, ["/tests"], trusted, wrote, left.made_by_verifier)
        if foreign and not error:   # the reward came from tests an agent's plugin could have rewritten
            why = error = f"{FOREIGN}: {', '.join(foreign[:5])}"
            reward = 0.0
    else:
        resolved, why, error = pytest_grade(records, problems, bool(_PYTEST_RESULT.search(output)), writable,
                                            ["/tests"], trusted, wrote, left.made_by_verifier)
        reward = 1.0 if resolved else 0.0
    if error and error.startswith(FOREIGN) and left.distrust:
        notes.append(f"nothing the tests made in the agent's folders counted as the verifier's: {left.distrust}")
    if not records:   # the harness may have died before its tests: say where, as its output does
        failure = harness_failure(output)
        if failure:
            notes.append(f"no pytest record: the test harness's output says {failure!r}")
    verdict = f"\n[verifier error: {why}]" if error else f"\n[{why}]"
    return Grade(reward, output + verdict, error, suspicious, notes, tests_ran)


# --- the two reference agents: what `dockyard env check` runs ---------------------------------

def oracle_agent(task: TerminalTask, sandbox: Sandbox) -> str:
    """Runs the task's own solution where the agent would work (solve.sh / solution.sh, or the
    keystrokes of a solution.yaml in a shell session)."""
    if task.solution is None:
        raise SandboxError(f"task {task.name}: no solution (solution.sh, solution.yaml or solution/solve.sh)")
    if task.solution.suffix == ".yaml":
        steps = yaml.safe_load(task.solution.read_text()) or []
        shell, outputs = sandbox.shell(), []
        for step in steps:
            command = step["command"] if isinstance(step, dict) else str(step)
            timeout = float(step.get("max_timeout_sec", task.agent_timeout_s)) if isinstance(step, dict) else None
            outputs.append(shell.run(command.rstrip("\n"), timeout_s=timeout).output)
        shell.close()
        return "\n".join(outputs)
    sandbox.copy_in(task.solution.parent if task.layout == "harbor" else task.solution,
                    "/solution" if task.layout == "harbor" else "/solution/solution.sh", read_only=True)
    script = "/solution/solve.sh" if task.layout == "harbor" else "/solution/solution.sh"
    result = sandbox.run(f"bash {script}", timeout_s=task.agent_timeout_s)
    return result.output + (f"\n[solution timed out after {task.agent_timeout_s:.0f} s]" if result.timed_out else "")


def noop_agent(task: TerminalTask, sandbox: Sandbox) -> str:
    """Does nothing: a task it solves tests nothing."""
    return ""


AGENTS: dict[str, Callable[[TerminalTask, Sandbox], str]] = {"oracle": oracle_agent, "noop": noop_agent}


def run_trial(task: TerminalTask, make_sandbox: Callable[[SandboxSpec], Sandbox],
              agent: Callable[[TerminalTask, Sandbox], str], grading: str = "same_sandbox",
              image: TaskImage | None = None, policy: NetworkPolicy = NetworkPolicy()) -> TrialResult:
    started = time.monotonic()
    result = TrialResult(task.name, 0.0, 0.0)
    sandbox = None
    try:
        sandbox = make_sandbox(sandbox_spec(task, image, policy))
        result.notes = setup_notes(task, sandbox, image)
        result.agent_output = agent(task, sandbox)
        sandbox = grading_sandbox(task, sandbox, make_sandbox, grading, result.notes)
        grade = verify(task, sandbox)
        result.reward, result.test_output, result.verifier_error = grade.reward, grade.output, grade.error
        result.suspicious, result.notes = grade.suspicious, result.notes + grade.notes
        result.tests_ran = grade.tests_ran
        if grade.error:
            result.notes.append(f"verifier error: {grade.error}")
        if grade.suspicious:
            result.notes.append(f"reward hack suspected: {', '.join(grade.suspicious[:5])}")
    except SandboxError as err:
        result.error = str(err)
    finally:
        if sandbox is not None:
            sandbox.destroy()
    result.seconds = time.monotonic() - started
    return result
