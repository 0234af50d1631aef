"""`dockyard env check`: each task of a task set through the same sandbox and scoring path a run
uses, with a reference agent instead of the model (each environment's `reference_trials`). The oracle (the task's own solution) must solve
every task and the no-op agent none: a task that fails either test is broken (its tests pass
without work, or its solution does not satisfy them), and the command names it."""

from __future__ import annotations

import sys
from pathlib import Path

from dockyard import registry
from dockyard.config.schema import MasterConfig
from dockyard.data.datasets import DatasetError
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


def check(cfg: MasterConfig, tasks: str | None, agent: str, out=sys.stdout) -> int:
    environment = registry.get("environment", cfg.env.name).factory
    trials = getattr(environment, "reference_trials", None)
    if trials is None:
        print(f"dockyard env check: environment {cfg.env.name!r} has no task sets to check (env.name)", file=sys.stderr)
        return 2
    try:
        results, problems = trials(cfg, task_source(cfg, tasks), agent)
    except (TaskFormatError, SandboxError, ValueError, DatasetError) as err:
        print(f"dockyard env check: {err}", file=sys.stderr)
        return 2
    for problem in problems:
        print(f"BAD TASK {problem}", file=out)
    if not results:
        print("dockyard env check: no task could be read", file=sys.stderr)
        return 2
    where = f"sandbox {cfg.env.sandbox.type}, {cfg.env.num_workers} at a time (env.num_workers)" if cfg.env.sandbox \
        else "no sandbox"
    print(f"{len(results)} tasks, agent {agent}, {where}", file=out, flush=True)
    width = max(len(r.task) for r in results)
    print(f"{'task':<{width}}  reward  seconds  notes", file=out)
    broken = []
    for result in results:
        if result.error or result.reward != EXPECTED[agent]:
            broken.append(result)
        notes = "; ".join(([f"ERROR: {result.error}"] if result.error else []) + result.notes)
        print(f"{result.task:<{width}}  {result.reward:>6.2f}  {result.seconds:>7.1f}  {notes}", file=out)
    mean = sum(r.reward for r in results) / len(results)
    print(f"mean reward {mean:.2f} over {len(results)} tasks", file=out)
    for result in broken:
        why = result.error or (f"the {agent} agent got reward {result.reward:.2f}, expected {EXPECTED[agent]:.0f}")
        tail = (result.test_output or "").strip().splitlines()[-6:]
        print(f"BROKEN {result.task}: {why}" + ("".join(f"\n    {line}" for line in tail) if tail else ""), file=out)
    return 1 if broken or problems else 0
