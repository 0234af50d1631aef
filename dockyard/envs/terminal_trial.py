"""One trial of a terminal task: a sandbox built from the task, an agent at work in it, then the
task's own tests, which decide the reward.

The order matters for honesty: the agent's shells are closed before verification; the tests are
copied only then, into /tests, read-only (the agent could not have written there: the sandbox's
root is read-only), and the Harbor reward folder /logs/verifier is created empty at that moment,
so nothing the agent did can plant a result. The oracle agent alone gets the task's solution, in
/solution, read-only.
"""

from __future__ import annotations

import json
import re
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import yaml

from dockyard.envs.terminal_tasks import TerminalTask
from dockyard.sandboxes.base import Sandbox, SandboxError, SandboxSpec

_PYTEST_RESULT = re.compile(r"^(PASSED|FAILED|ERROR|XPASS|XFAIL|SKIPPED)\s+(\S+)", re.MULTILINE)


@dataclass
class TrialResult:
    task: str
    reward: float
    seconds: float
    agent_output: str = ""
    test_output: str = ""
    notes: list[str] = field(default_factory=list)
    error: str | None = None

    @property
    def resolved(self) -> bool:
        return self.reward >= 1.0


def sandbox_spec(task: TerminalTask) -> SandboxSpec:
    """The task's Dockerfile as far as a sandbox without an image builder honours it."""
    return SandboxSpec(workdir=task.setup.workdir or "", files=list(task.setup.copies), env=dict(task.setup.env),
                       name=f"task {task.name}", run=list(task.setup.run),
                       network=bool(task.metadata.get("environment", {}).get("allow_internet", False)))


def setup_notes(task: TerminalTask, sandbox: Sandbox) -> list[str]:
    notes = []
    if task.setup.image:
        image = getattr(sandbox, "image", None)
        root = (f"env.sandbox.image {image!r}" if image else "this machine itself" if sandbox.kind == "none"
                else "this machine's /usr and /etc, read-only")
        notes.append(f"base image {task.setup.image} not used (nothing is pulled): the {sandbox.kind} sandbox runs "
                     f"commands on {root}")
    if task.setup.run and not sandbox.builds_images:
        notes.append(f"{len(task.setup.run)} RUN line(s) of {task.dockerfile} skipped: this sandbox builds no images")
    if task.setup.ignored:
        notes.append(f"{len(task.setup.ignored)} Dockerfile line(s) without effect here: "
                     + "; ".join(line.split()[0] for line in task.setup.ignored))
    return notes


def pytest_statuses(output: str) -> dict[str, str]:
    """Each test id's status in a pytest -rA summary (PASSED, FAILED, ERROR, XPASS, XFAIL, SKIPPED)."""
    return {name: status for status, name in _PYTEST_RESULT.findall(output)}


def pytest_resolved(output: str) -> tuple[bool, str]:
    """Terminal-Bench's pytest parser: resolved when the -rA summary lists tests and all passed."""
    results = _PYTEST_RESULT.findall(output)
    if not results:
        return False, "no pytest results in the output (run-tests.sh must run pytest with -rA)"
    failed = [name for status, name in results if status in ("FAILED", "ERROR")]
    if failed:
        return False, f"{len(failed)} of {len(results)} tests failed: {', '.join(failed[:5])}"
    return True, f"{len(results)} tests passed"


def verify(task: TerminalTask, sandbox: Sandbox) -> tuple[float, str]:
    for source, target in task.tests:
        sandbox.copy_in(source, target, read_only=True)
    with tempfile.TemporaryDirectory() as empty:
        sandbox.copy_in(Path(empty), "/logs/verifier")
    result = sandbox.run(task.test_command, timeout_s=task.test_timeout_s, env={"TEST_DIR": "/tests"})
    output = result.output
    if result.timed_out:
        return 0.0, output + f"\n[tests timed out after {task.test_timeout_s:.0f} s]"
    if task.layout == "harbor":
        reward = _harbor_reward(sandbox)
        if reward is not None:
            return reward, output
        return (1.0 if result.exit_code == 0 else 0.0), output + "\n[no reward file; the exit status decided]"
    resolved, why = pytest_resolved(output)
    return (1.0 if resolved else 0.0), output + f"\n[{why}]"


def _harbor_reward(sandbox: Sandbox) -> float | None:
    with tempfile.TemporaryDirectory() as folder:
        for name in ("reward.txt", "reward.json"):
            target = Path(folder) / name
            try:
                sandbox.copy_out(f"/logs/verifier/{name}", target)
            except SandboxError:
                continue
            text = target.read_text().strip()
            try:
                value = json.loads(text) if name.endswith(".json") else float(text)
            except (ValueError, json.JSONDecodeError):
                return 0.0
            if isinstance(value, dict):
                value = value.get("reward", 0.0)
            return float(value) if isinstance(value, (int, float)) else 0.0
    return None


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
              agent: Callable[[TerminalTask, Sandbox], str]) -> TrialResult:
    started = time.monotonic()
    result = TrialResult(task.name, 0.0, 0.0)
    try:
        with make_sandbox(sandbox_spec(task)) as sandbox:
            result.notes = setup_notes(task, sandbox)
            result.agent_output = agent(task, sandbox)
            for session in sandbox._shells:
                session.close()
            result.reward, result.test_output = verify(task, sandbox)
    except SandboxError as err:
        result.error = str(err)
    result.seconds = time.monotonic() - started
    return result
