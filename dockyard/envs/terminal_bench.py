"""`terminal_bench`: multi-turn shell tasks in a sandbox, scored by each task's own tests.

A dataset row is a task: its instruction (the prompt) and, under the metadata key, `path`: the
task folder (Terminal-Bench or Harbor layout, see terminal_tasks.py), relative to the dataset file.
`dockyard env index DIR` writes such a jsonl for a folder of tasks.

An episode: a sandbox built from the task's Dockerfile (WORKDIR, COPY, ENV), one persistent shell in
it (the agent's terminal), the agent's `bash` calls run there with their own timeout (at most
env.sandbox.command_exec_timeout_s), and at the end the task's tests (terminal_trial.verify). The
agent's time is the task's max_agent_timeout_sec, at most env.task_timeout_s.

Extra env keys: `tool_format` (auto | hermes | plain, see dockyard/agents/tool_format.py),
`max_output_chars` (how much of a command's output the model sees; 4000), `grading`
(same_sandbox | fresh_sandbox: where the tests run, see terminal_trial.py and docs/agents.md),
`verifier_allow_internet` (the tests get the network, never the agent; false) and
`allow_internet_default` (the agent's network for a task whose layout has no `allow_internet`, as
Terminal-Bench 1's; false).
An episode reports what in its workspace shadows test machinery (`suspicious`) and a verifier
error (`verifier_error`); the rollouts count both per step.
"""

from __future__ import annotations

import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from dockyard.agents.tool_format import TERMINAL_TOOLS, Action
from dockyard.config.schema.env import EnvConfig, SandboxConfig
from dockyard.data.datasets import Prompt, row_path
from dockyard.envs.terminal_tasks import TaskFormatError, TerminalTask, load_task, load_tasks
from dockyard.envs.terminal_trial import (AGENTS, GRADINGS, NetworkPolicy, TrialResult, grading_sandbox, run_trial,
                                          sandbox_spec, setup_notes, verify)
from dockyard.errors import DockyardError
from dockyard.sandboxes.base import Sandbox, SandboxError
from dockyard.sandboxes.factory import SandboxFactory
from dockyard.sandboxes.images import TaskImage

KNOWN_EXTRA = {"tool_format", "max_output_chars", "grading", "allow_internet_default", "verifier_allow_internet"}


class TerminalBenchEnvironment:
    """Terminal tasks for a multi-turn agent (env.agent: tool_calling)."""

    multi_turn = True
    task_images = True   # reads env.sandbox.task_images (its tasks' Dockerfiles)
    tools = TERMINAL_TOOLS
    EXTRA_KEYS = KNOWN_EXTRA

    @classmethod
    def check_settings(cls, config: EnvConfig) -> dict:
        """The env settings, checked (ValueError naming the field); the preflight calls it too."""
        extra = dict(config.model_extra or {})
        unknown = sorted(set(extra) - KNOWN_EXTRA)
        if unknown:
            raise ValueError(f"env.{unknown[0]}: not a terminal_bench setting (known: {', '.join(sorted(KNOWN_EXTRA))})")
        if extra.get("grading", "same_sandbox") not in GRADINGS:
            raise ValueError(f"env.grading: {extra['grading']!r} is not one of {', '.join(GRADINGS)}")
        for key in ("allow_internet_default", "verifier_allow_internet"):
            if not isinstance(extra.get(key, False), bool):
                raise ValueError(f"env.{key}: must be true or false, got {extra[key]!r}")
        return extra

    @classmethod
    def network_policy(cls, config: EnvConfig) -> NetworkPolicy:
        extra = cls.check_settings(config)
        return NetworkPolicy(agent_default=extra.get("allow_internet_default", False),
                             verifier=extra.get("verifier_allow_internet", False))

    def __init__(self, config: EnvConfig):
        extra = self.check_settings(config)
        self.config = config
        self.tool_format = str(extra.get("tool_format", "auto"))
        self.max_output_chars = int(extra.get("max_output_chars", 4000))
        self.grading = str(extra.get("grading", "same_sandbox"))
        self.network = self.network_policy(config)
        self.sandboxes = SandboxFactory(config.sandbox or SandboxConfig())
        self._tasks: dict[Path, TerminalTask] = {}
        self._images: dict[Path, TaskImage | None] = {}
        self._lock = threading.Lock()

    @property
    def capacity(self) -> int:
        """Episodes that can be open at once: one sandbox each."""
        return self.sandboxes.config.max_concurrent

    def task_for(self, prompt: Prompt) -> TerminalTask:
        folder = row_path(prompt)
        if folder is None:
            raise TaskFormatError(f"dataset {prompt.source!r}: a terminal_bench row needs its task folder as `path` "
                                  "in its metadata (data.datasets[].metadata_key)")
        with self._lock:
            if folder not in self._tasks:
                self._tasks[folder] = load_task(folder)
            return self._tasks[folder]

    def open(self, prompt: Prompt) -> "TerminalEpisode":
        return TerminalEpisode(self, self.task_for(prompt))

    def image_for(self, task: TerminalTask) -> TaskImage | None:
        """The task's built image (env.sandbox.task_images: build; built at its first episode), or None."""
        with self._lock:
            if task.folder not in self._images:
                self._images[task.folder] = task_images(self.sandboxes, task)
            return self._images[task.folder]

    @classmethod
    def build_command(cls, cfg, source: Path, out=sys.stdout, rebuild: bool = False) -> int:
        return build_command(cfg, source, out, rebuild)

    @classmethod
    def reference_trials(cls, cfg, source: Path, agent: str, out=sys.stderr, rebuild: bool = False
                         ) -> tuple[list[TrialResult], list[str]]:
        """`dockyard env check`: every task in a sandbox with the oracle or the no-op agent at work. A
        task that cannot be read, or whose image does not build, is reported and the others still run."""
        problems: list[str] = []
        tasks = load_tasks(source, problems)
        grading = cls.check_settings(cfg.env).get("grading", "same_sandbox")
        policy = cls.network_policy(cfg.env)
        factory = SandboxFactory(cfg.env.sandbox or SandboxConfig())
        images, failed = build_images(factory, tasks, out, rebuild)

        def trial(task: TerminalTask) -> TrialResult:
            if task.name in failed:
                return TrialResult(task.name, 0.0, 0.0, error=f"image build: {failed[task.name]}")
            return run_trial(task, factory.create, AGENTS[agent], grading, images.get(task.name), policy)

        with ThreadPoolExecutor(max_workers=cfg.env.num_workers) as pool:
            return list(pool.map(trial, tasks)), problems


def task_images(factory: SandboxFactory, task: TerminalTask, rebuild: bool = False) -> TaskImage | None:
    """The task's image with its compose services' images (`services`), built where missing; None when
    images are not built or the task has no Dockerfile (its services are then refused when it runs)."""
    image = factory.task_image(task.name, task.dockerfile, task.build_context, rebuild)
    if image is not None and factory.backend.runs_services:   # elsewhere the sandbox refuses them by name
        image.services = {s.name: factory.service_image(task.name, s.name, s.dockerfile, s.context, s.image, rebuild)
                          for s in task.sidecars}
    return image


def build_images(factory: SandboxFactory, tasks: list[TerminalTask], out=sys.stderr, rebuild: bool = False
                 ) -> tuple[dict[str, TaskImage | None], dict[str, str]]:
    """Every task's image, built where missing, one line per task: (images by task, errors by task)."""
    images: dict[str, TaskImage | None] = {}
    failed: dict[str, str] = {}
    if factory.images is None:
        return images, failed
    for number, task in enumerate(tasks, 1):
        try:
            image = images[task.name] = task_images(factory, task, rebuild)
        except SandboxError as err:
            failed[task.name] = str(err)
            print(f"[{number}/{len(tasks)}] {task.name}: image build failed: {' '.join(str(err).split())[:300]}",
                  file=out, flush=True)
            continue
        state = "no Dockerfile" if image is None else \
            f"{'built' if image.built_now else 'cached'} in {image.seconds:.1f} s ({image.tag})" + "".join(
                f"; service {name} {'built' if built.built_now else 'cached'} in {built.seconds:.1f} s"
                for name, built in image.services.items())
        print(f"[{number}/{len(tasks)}] {task.name}: {state}", file=out, flush=True)
    return images, failed


def build_command(cfg, source: Path, out=sys.stdout, rebuild: bool = False) -> int:
    """`dockyard env build`: every task's image ahead of a run (on a login node, say), or again from
    nothing with `rebuild`; exit 1 if one fails."""
    problems: list[str] = []
    tasks = load_tasks(source, problems)
    for problem in problems:
        print(f"BAD TASK {' '.join(problem.split())}", file=out)
    sandbox = cfg.env.sandbox or SandboxConfig()
    if sandbox.task_images != "build":
        raise DockyardError("env.sandbox.task_images is host (nothing to build); set it to build")   # a setting: exit 2
    factory = SandboxFactory(sandbox)
    started = time.monotonic()
    images, failed = build_images(factory, tasks, out, rebuild)
    built = sum(1 for image in images.values() if image is not None and image.built_now)
    print(f"{len(tasks)} tasks: {built} built, {len(images) - built} cached or without a Dockerfile, {len(failed)} "
          f"failed, in {time.monotonic() - started:.1f} s (cache: {factory.images.cache_dir})", file=out)
    return 1 if failed or problems else 0


class ShellEpisode:
    """An agent's episode in one sandbox through one persistent shell: its bash calls, each within
    the sandbox's command limit and the episode's deadline, recorded in `events`. Subclasses score it
    (`finish`)."""

    def __init__(self, sandbox: Sandbox, time_s: float, max_output_chars: int, name: str):
        self.sandbox, self.name, self.max_output_chars = sandbox, name, max_output_chars
        self.shell = sandbox.shell()
        self.deadline = time.monotonic() + time_s
        self.events: list[dict] = []
        self.suspicious: list[str] = []          # what in the workspace shadows test machinery (grading.py)
        self.verifier_error: str | None = None

    @property
    def out_of_time(self) -> bool:
        return time.monotonic() >= self.deadline

    def execute(self, action: Action) -> str:
        """Run a bash call in the agent's shell; the text the model sees (output, exit status)."""
        limit = self.sandbox.limits.command_timeout_s
        timeout = min(float(action.arguments.get("timeout", limit)), limit, max(self.deadline - time.monotonic(), 1.0))
        try:
            result = self.shell.run(action.arguments["command"], timeout_s=timeout)
        except SandboxError as err:
            raise RuntimeError(f"{self.name}: {err}") from None
        output = result.output
        cap = self.max_output_chars
        if len(output) > cap:
            output = output[:cap // 2] + f"\n[... {len(output) - cap} characters left out ...]\n" + output[-cap // 2:]
        status = "timed out" if result.timed_out else f"exit status {result.exit_code}"
        self.events.append({"command": action.arguments["command"], "exit_code": result.exit_code,
                            "timed_out": result.timed_out, "seconds": round(result.seconds, 3),
                            "output": output})
        return f"{output}\n[{status}]" if output else f"[{status}]"

    def close(self) -> None:
        self.sandbox.destroy()


class TerminalEpisode(ShellEpisode):
    def __init__(self, env: TerminalBenchEnvironment, task: TerminalTask):
        self.env, self.task = env, task
        image = env.image_for(task)
        sandbox = env.sandboxes.create(sandbox_spec(task, image, env.network))
        super().__init__(sandbox, min(task.agent_timeout_s, env.config.task_timeout_s), env.max_output_chars,
                         f"task {task.name}")
        self.notes = setup_notes(task, sandbox, image)

    def finish(self) -> float:
        """Hand the sandbox over to the verifier and run the task's tests: the reward."""
        self.sandbox = grading_sandbox(self.task, self.sandbox, self.env.sandboxes.create, self.env.grading, self.notes)
        grade = verify(self.task, self.sandbox)
        self.suspicious, self.verifier_error = grade.suspicious, grade.error
        self.events.append({"tests": grade.output[-4000:], "reward": grade.reward, "verifier_error": grade.error,
                            "suspicious": grade.suspicious, "notes": grade.notes})
        return grade.reward
