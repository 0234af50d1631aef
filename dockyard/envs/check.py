"""`dockyard env check`: each task of a task set through the same sandbox and scoring path a run
uses, with a reference agent instead of the model. The oracle (the task's own solution) must solve
every task and the no-op agent none: a task that fails either test is broken (its tests pass
without work, or its solution does not satisfy them), and the command names it."""

from __future__ import annotations

import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from dockyard.config.schema import MasterConfig
from dockyard.config.schema.env import SandboxConfig
from dockyard.envs.terminal_tasks import TaskFormatError, load_tasks
from dockyard.envs.terminal_trial import AGENTS, TrialResult, run_trial
from dockyard.sandboxes.base import SandboxError
from dockyard.sandboxes.factory import SandboxFactory

EXPECTED = {"oracle": 1.0, "noop": 0.0}


def task_source(cfg: MasterConfig, tasks: str | None) -> Path:
    if tasks:
        return Path(tasks)
    datasets = [d for d in cfg.data.datasets if getattr(d, "path", None)]
    if not datasets:
        raise TaskFormatError("no task set: give --tasks DIR (or a jsonl index), or a data.datasets path")
    return Path(datasets[0].path)


def check(cfg: MasterConfig, tasks: str | None, agent: str, out=sys.stdout) -> int:
    try:
        task_list = load_tasks(task_source(cfg, tasks))
        factory = SandboxFactory(cfg.env.sandbox or SandboxConfig())
    except (TaskFormatError, SandboxError) as err:
        print(f"dockyard env check: {err}", file=sys.stderr)
        return 2
    print(f"{len(task_list)} tasks, agent {agent}, sandbox {factory.config.type}, "
          f"{cfg.env.num_workers} at a time (env.num_workers)", file=out, flush=True)
    with ThreadPoolExecutor(max_workers=cfg.env.num_workers) as pool:
        results: list[TrialResult] = list(pool.map(lambda t: run_trial(t, factory.create, AGENTS[agent]), task_list))
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
    return 1 if broken else 0
