"""`dockyard env check`: each task of a task set through the same sandbox and scoring path a run
uses, with a reference agent instead of the model (each environment's `reference_trials`). The oracle (the task's own solution) must solve
every task and the no-op agent none: a task that fails either test is broken (its tests pass
without work, or its solution does not satisfy them), and the command names it."""

from __future__ import annotations

import re
import sys
import tempfile
from pathlib import Path

from dockyard import registry
from dockyard.config.schema import MasterConfig
from dockyard.data.datasets import DatasetError
from dockyard.envs.grading import NETWORK_FAILURES
from dockyard.envs.terminal_tasks import TaskFormatError
from dockyard.sandboxes.base import SandboxError

EXPECTED = {"oracle": 1.0, "noop": 0.0}


def task_source(cfg: MasterConfig, tasks: str | None) -> Path:
    if tasks:
        return Path(tasks)
    datasets = [d for d in cfg.data.datasets if getattr(d, "path", None)]
    if not datasets:
        raise TaskFormatError("no task set: give --tasks DIR (or a jsonl index), or a data.datasets path")
    return Path(datasets[0].path)


def source_prompts(cfg: MasterConfig, source) -> list:
    """The rows of a task file read as the run reads them: with the first dataset's keys and pre-processor."""
    from dockyard.data.datasets import load_prompts

    if not cfg.data.datasets:
        raise DatasetError("no dataset to check: data.datasets is empty")
    return load_prompts(cfg.data.datasets[0].model_copy(update={"path": str(source), "generator": None}))


NOTE_CHARS = 160
TELLING_NOTES = ("no pytest record", "verifier error", "reward hack")


ERROR_CLASSES = [   # what a SWE row's error says, as the class of its cause
    (re.compile(r"repository \S+ not found|cannot (export|check out|bundle) "), "repository"),
    (re.compile(r"needs Python [\d.]+, which this machine does not have"), "python version"),
    (re.compile(r"harness has no specification|not a Python repository of the harness|published image"),
     "no environment"),
]


def cause(result, agent: str) -> str:
    """Why a task failed its check, as a class a user can act on."""
    error = result.error or ""
    if error.startswith("image build") or ".Dockerfile failed:" in error:
        return "image build"
    for pattern, kind in ERROR_CLASSES:
        if pattern.search(error):
            return kind
    if error:
        return "sandbox"
    if result.tests_ran == "no":
        seen = (result.test_output or "") + " ".join(result.notes)
        return "network needed" if NETWORK_FAILURES.search(seen) else "tests did not run"
    return "tests failed" if agent == "oracle" else "tests pass without work"


def _one_line(text: str, limit: int = NOTE_CHARS) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def write_log(folder: Path, result) -> Path:
    path = folder / (re.sub(r"[^A-Za-z0-9._-]", "_", result.task) + ".log")   # task names may hold a / (HumanEval/0)
    parts = [f"task {result.task}: reward {result.reward:.2f}, tests ran: {result.tests_ran or '-'}, "
             f"{result.seconds:.1f} s"]
    if result.error:
        parts.append(f"error:\n{result.error}")
    if result.notes:
        parts.append("notes:\n" + "\n".join(f"- {note}" for note in result.notes))
    parts.append(f"agent output:\n{result.agent_output or ''}")
    parts.append(f"test output:\n{result.test_output or ''}")
    path.write_text("\n\n".join(parts) + "\n")
    return path


def check(cfg: MasterConfig, tasks: str | None, agent: str, out=sys.stdout, logs: str | None = None,
          rebuild: bool = False) -> int:
    environment = registry.get("environment", cfg.env.name).factory
    trials = getattr(environment, "reference_trials", None)
    if trials is None:
        print(f"dockyard env check: environment {cfg.env.name!r} has no task sets to check (env.name)", file=sys.stderr)
        return 2
    if rebuild and not (cfg.env.sandbox and cfg.env.sandbox.task_images == "build"):
        print("dockyard env check: --rebuild needs env.sandbox.task_images: build (nothing would be built)", file=sys.stderr)
        return 2
    try:
        results, problems = trials(cfg, task_source(cfg, tasks), agent, **({"rebuild": True} if rebuild else {}))
    except (TaskFormatError, SandboxError, ValueError, DatasetError) as err:
        print(f"dockyard env check: {err}", file=sys.stderr)
        return 2
    for problem in problems:
        print(f"BAD TASK {_one_line(problem, 400)} [task format]", file=out)
    if not results:
        print("dockyard env check: no task could be read", file=sys.stderr)
        return 2
    log_folder = Path(logs) if logs else Path(tempfile.mkdtemp(prefix="dockyard-env-check-"))
    log_folder.mkdir(parents=True, exist_ok=True)
    where = f"sandbox {cfg.env.sandbox.type}, {cfg.env.num_workers} at a time (env.num_workers)" if cfg.env.sandbox \
        else "no sandbox"
    print(f"{len(results)} tasks, agent {agent}, {where}", file=out, flush=True)
    width = max(len(r.task) for r in results)
    print(f"{'task':<{width}}  reward  tests        seconds  notes", file=out)
    broken = []
    for result in results:
        write_log(log_folder, result)
        if result.error or result.reward != EXPECTED[agent]:
            broken.append(result)
        first = [n for n in result.notes if n.startswith(TELLING_NOTES)]   # what decided the reward, before set-up notes
        notes = "; ".join(([f"ERROR: {result.error}"] if result.error else []) + first
                          + [n for n in result.notes if n not in first])
        print(f"{result.task:<{width}}  {result.reward:>6.2f}  {result.tests_ran or '-':<11}  {result.seconds:>7.1f}  "
              f"{_one_line(notes)}", file=out)
    mean = sum(r.reward for r in results) / len(results)
    print(f"mean reward {mean:.2f} over {len(results)} tasks", file=out)
    for result in broken:
        why = result.error or (f"the {agent} agent got reward {result.reward:.2f}, expected {EXPECTED[agent]:.0f}")
        tail = (result.test_output or "").strip().splitlines()[-6:]
        print(f"BROKEN {result.task} [{cause(result, agent)}]: {_one_line(why, 400)}"
              + ("".join(f"\n    {line[:200]}" for line in tail) if tail else ""), file=out)
    print(f"each task's whole output and notes: {log_folder}/<task>.log", file=out)
    return 1 if broken or problems else 0
