"""`gdpval`: knowledge-work tasks whose answer is a produced file (a CSV, a report, a spreadsheet, a
document), graded by checks on the file that each task declares (gdpval_files.py).

A row keeps GDPval's columns (task_id, sector, occupation, prompt, reference_files) and adds the
task's `rubric` (its deliverable's file name and checks) and, for `dockyard env check`,
`reference_solution` (a finished deliverable). reference_files and reference_solution are paths
relative to the task file (GDPval's own rows name files in its hub repository, which cannot be
fetched here: point them at your copy). Set metadata_key to null and label_key to the rubric column.

Two ways to work, by env.agent:
  - single shot (env.agent null): the reply holds the file's content in a fenced block (a markdown or
    text deliverable may be the whole reply); binary deliverables (xlsx, docx) need the agentic way
    and such tasks are left out, named;
  - agentic (env.agent tool_calling): a sandbox with the reference files in /workspace/reference, a
    shell the agent drives (bash, submit), and the deliverable read from /workspace/<name> when the
    episode ends.
Tasks whose rubric cannot be read, whose deliverable format is not in env.output_formats, or whose
reference files are missing are left out with the file and task named; the run goes on.

Extra env keys: grader (rubric: the declared checks; a judge model is not built and is refused),
output_formats (the deliverable formats accepted; md, txt, csv, json, html, xlsx, docx),
tool_format and max_output_chars (agentic, as terminal_bench).
"""

from __future__ import annotations

import re
import tempfile
import threading
from dataclasses import dataclass, replace
from pathlib import Path

from dockyard.agents.tool_format import TERMINAL_TOOLS
from dockyard.config.schema.env import EnvConfig, SandboxConfig
from dockyard.data.datasets import Prompt
from dockyard.envs.answers import kept_rows
from dockyard.envs.gdpval_files import BINARY_FORMATS, TEXT_FORMATS, RubricError, grade, read_rubric, suffix
from dockyard.envs.terminal_bench import ShellEpisode
from dockyard.sandboxes.base import SandboxError, SandboxSpec
from dockyard.sandboxes.factory import SandboxFactory

WORKSPACE = "/workspace"
KNOWN_EXTRA = {"grader", "output_formats", "tool_format", "max_output_chars"}
_FENCED = re.compile(r"```[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)


@dataclass
class GdpvalTask:
    name: str
    rubric: dict
    references: list[Path]
    solution: Path | None

    @property
    def deliverable(self) -> str:
        return self.rubric["deliverable"]


def extract_deliverable(reply: str, deliverable: str) -> str | None:
    """The file's content in a reply: its last fenced block; a markdown or text file may be the whole reply."""
    blocks = _FENCED.findall(reply)
    if blocks:
        return blocks[-1].rstrip("\n") + "\n"
    if suffix(deliverable) in ("md", "txt") and reply.strip():
        return reply.strip() + "\n"
    return None


class GdpvalEnvironment:
    multi_turn = None    # either way: single shot without env.agent, agentic with one
    tools = TERMINAL_TOOLS
    EXTRA_KEYS = frozenset(KNOWN_EXTRA)

    @classmethod
    def check_settings(cls, config: EnvConfig) -> dict:
        """The env settings, checked (ValueError naming the field); the preflight calls it too."""
        extra = dict(config.model_extra or {})
        unknown = sorted(set(extra) - KNOWN_EXTRA)
        if unknown:
            raise ValueError(f"env.{unknown[0]}: not a gdpval setting (known: {', '.join(sorted(KNOWN_EXTRA))})")
        if extra.get("grader", "rubric") != "rubric":
            raise ValueError(f"env.grader: {extra['grader']!r} is not built; gdpval grades by each task's rubric "
                             "checks (grader: rubric)")
        formats = extra.get("output_formats", list(TEXT_FORMATS + BINARY_FORMATS))
        if not isinstance(formats, list) or not formats or any(f not in TEXT_FORMATS + BINARY_FORMATS for f in formats):
            raise ValueError(f"env.output_formats: must list formats among {', '.join(TEXT_FORMATS + BINARY_FORMATS)}")
        if config.reward is not None:
            raise ValueError("env.reward: gdpval is graded by each task's rubric; set env.reward to null")
        agent_only = sorted(set(extra) & {"tool_format", "max_output_chars"})
        if agent_only and config.agent is None:
            raise ValueError(f"env.{agent_only[0]}: a setting of the agentic gdpval (env.agent); single shot has no tools")
        if config.agent is None and config.sandbox is not None:
            raise ValueError("env.sandbox: single-shot gdpval runs nothing in a sandbox; set env.sandbox to null "
                             "or give it an agent (env.agent: tool_calling)")
        return extra

    def __init__(self, config: EnvConfig):
        extra = self.check_settings(config)
        self.config = config
        self.formats = list(extra.get("output_formats", list(TEXT_FORMATS + BINARY_FORMATS)))
        self.multi_turn = config.agent is not None
        self.tool_format = str(extra.get("tool_format", "auto"))
        self.max_output_chars = int(extra.get("max_output_chars", 4000))
        self.sandboxes = SandboxFactory(config.sandbox or SandboxConfig()) if self.multi_turn else None
        self._tasks: dict[tuple[str, str], GdpvalTask] = {}
        self._lock = threading.Lock()

    @property
    def capacity(self) -> int | None:
        return self.sandboxes.config.max_concurrent if self.sandboxes else None

    # --- tasks ------------------------------------------------------------------------------

    def task_for(self, prompt: Prompt) -> GdpvalTask:
        row = prompt.metadata
        name = str(row.get("task_id") or "?")
        key = (str(prompt.source_file or prompt.source), name)
        with self._lock:
            if key in self._tasks:
                return self._tasks[key]
        where = f"{key[0]}: task {name}"
        try:
            rubric = read_rubric(prompt.label if prompt.label is not None else row.get("rubric"))
        except RubricError as err:
            raise RubricError(f"{where}: {err}") from None
        base = Path(prompt.source_file).resolve().parent if prompt.source_file else Path.cwd()
        references = [base / str(path) for path in row.get("reference_files") or []]
        missing = [str(path) for path in references if not path.is_file()]
        if missing:
            raise RubricError(f"{where}: reference file {missing[0]} not found")
        solution = base / row["reference_solution"] if row.get("reference_solution") else None
        task = GdpvalTask(name, rubric, references, solution)
        with self._lock:
            self._tasks[key] = task
        return task

    def split_rows(self, prompts: list[Prompt]) -> tuple[list[Prompt], list[tuple[Prompt, str]]]:
        ready, dropped = [], []
        for prompt in prompts:
            try:
                task = self.task_for(prompt)
            except RubricError as err:
                dropped.append((prompt, str(err).split(": ", 1)[-1]))
                continue
            kind = suffix(task.deliverable)
            if kind not in self.formats:
                dropped.append((prompt, f"task {task.name}: its {kind} deliverable is not in env.output_formats"))
            elif kind in BINARY_FORMATS and not self.multi_turn:
                dropped.append((prompt, f"task {task.name}: a {kind} deliverable cannot be written in a reply "
                                        "(single shot); the agentic variant (env.agent) produces it"))
            else:
                ready.append(replace(prompt, input=str(prompt.input).rstrip() + "\n\n" + self.instruction(task)))
        return ready, dropped

    def prepare_prompts(self, prompts: list[Prompt]) -> list[Prompt]:
        return kept_rows(*self.split_rows(prompts), "gdpval")

    def instruction(self, task: GdpvalTask) -> str:
        if not self.multi_turn:
            return f"Deliverable: {task.deliverable}. Reply with its complete content in one fenced code block."
        where = (f"The reference files are in {WORKSPACE}/reference/. " if task.references else "")
        return f"{where}Save the deliverable as {WORKSPACE}/{task.deliverable}, then submit."

    # --- single shot --------------------------------------------------------------------------

    def grade_text(self, task: GdpvalTask, content: str | None) -> tuple[float, list[str]]:
        if content is None:
            return grade(task.rubric, None)
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / task.deliverable
            path.write_text(content)
            return grade(task.rubric, path)

    def score(self, completion: str, prompt: Prompt) -> float:
        task = self.task_for(prompt)
        return self.grade_text(task, extract_deliverable(completion, task.deliverable))[0]

    def action_valid(self, completion: str) -> bool:
        """Single shot: the action is the file; invalid when the reply holds no fenced block."""
        return bool(_FENCED.search(completion))

    # --- agentic ------------------------------------------------------------------------------

    def open(self, prompt: Prompt) -> "GdpvalEpisode":
        return GdpvalEpisode(self, self.task_for(prompt))

    # --- env check ----------------------------------------------------------------------------

    @classmethod
    def reference_trials(cls, cfg, source, agent: str):
        """`dockyard env check`: the task's reference_solution handed in (oracle) or nothing (noop),
        single shot as a reply, agentic through an episode's sandbox."""
        from concurrent.futures import ThreadPoolExecutor

        from dockyard.envs.check import source_prompts
        from dockyard.envs.terminal_trial import TrialResult

        env = cls(cfg.env)
        ready, dropped = env.split_rows(source_prompts(cfg, source))
        problems = [f"{p.source_file or p.source}: {why}" for p, why in dropped]

        def trial(prompt: Prompt) -> TrialResult:
            task = env.task_for(prompt)
            result = TrialResult(task.name, 0.0, 0.0)
            if agent == "oracle" and (task.solution is None or not task.solution.is_file()):
                result.error = f"no reference_solution file for task {task.name}"
                return result
            try:
                if env.multi_turn:
                    episode = env.open(prompt)
                    try:
                        if agent == "oracle":
                            episode.sandbox.copy_in(task.solution, f"{WORKSPACE}/{task.deliverable}")
                        result.reward = episode.finish()
                        result.test_output = "\n".join(episode.events[-1]["checks"])
                    finally:
                        episode.close()
                else:
                    reply = f"```\n{task.solution.read_text()}```" if agent == "oracle" else ""
                    result.reward, lines = env.grade_text(task, extract_deliverable(reply, task.deliverable))
                    result.test_output = "\n".join(lines)
            except (SandboxError, RuntimeError) as err:
                result.error = str(err)
            return result

        with ThreadPoolExecutor(max_workers=cfg.env.num_workers) as pool:
            return list(pool.map(trial, ready)), problems


class GdpvalEpisode(ShellEpisode):
    def __init__(self, env: GdpvalEnvironment, task: GdpvalTask):
        self.env, self.task = env, task
        files = [(path, f"{WORKSPACE}/reference/{path.name}") for path in task.references]
        sandbox = env.sandboxes.create(SandboxSpec(workdir=WORKSPACE, files=files, name=f"task {task.name}"))
        super().__init__(sandbox, env.config.task_timeout_s, env.max_output_chars, f"task {task.name}")

    def finish(self) -> float:
        """Close the agent's shell and grade the deliverable it left in the workspace."""
        self.shell.close()
        with tempfile.TemporaryDirectory() as folder:
            target = Path(folder) / self.task.deliverable
            try:
                self.sandbox.copy_out(f"{WORKSPACE}/{self.task.deliverable}", target)
            except SandboxError:
                target = None
            reward, lines = grade(self.task.rubric, target)
        self.events.append({"checks": lines, "reward": reward})
        return reward
