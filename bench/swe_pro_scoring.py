"""SWE-bench Pro rows: what scoring a patch costs with the row's own run_script.sh and parser.py (the
parser in a sandbox of its own) against pytest over the selected files with pytest's own record.

    python bench/swe_pro_scoring.py [--rows tasks/swe/swe_pro.jsonl] [--run-scripts DIR]
                                    [--kind bubblewrap|podman] [--repeats 3]

For every row prints the median seconds and the reward of the gold patch and of the no-op (an empty
patch) both ways. Rows whose run_scripts/<instance_id>/ folder is missing are named and skipped.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dockyard.config.schema.env import SandboxConfig  # noqa: E402
from dockyard.envs.swe import SweScorer  # noqa: E402
from dockyard.envs.swe_pro import RunScripts  # noqa: E402
from dockyard.envs.swe_tasks import RepoStore, SweTaskError, read_task_file  # noqa: E402
from dockyard.sandboxes.factory import SandboxFactory  # noqa: E402


class WithoutScripts(RunScripts):
    """pytest over the selected files, as a Pro row without a run_scripts folder is scored."""

    def for_task(self, task):
        return None


def timed(scorer: SweScorer, task, patch: str, repeats: int) -> tuple[float, float]:
    seconds, reward = [], None
    for _ in range(repeats):
        started = time.monotonic()
        reward = scorer.score(task, patch).reward
        seconds.append(time.monotonic() - started)
    return statistics.median(seconds), reward


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default=str(Path(__file__).resolve().parent.parent / "tasks/swe/swe_pro.jsonl"))
    parser.add_argument("--run-scripts", default=None, help="SWE-bench Pro's run_scripts/ (default: beside --rows)")
    parser.add_argument("--kind", choices=("bubblewrap", "podman"), default="bubblewrap")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    tasks, problems = read_task_file(args.rows)
    for problem in problems:
        print(f"BAD ROW {problem}")
    repos = RepoStore(None)
    factory = SandboxFactory(SandboxConfig(type=args.kind, command_exec_timeout_s=600, max_concurrent=2))
    ways = {"run script + parser": RunScripts(args.run_scripts), "pytest record": WithoutScripts(None)}
    print(f"{'row':60s} {'way':20s} {'gold s':>7s} {'reward':>6s} {'no-op s':>8s} {'reward':>6s}")
    try:
        for task in tasks:
            try:
                ways["run script + parser"].for_task(task) or print(f"{task.instance_id}: no run_scripts folder")
            except SweTaskError as err:
                print(f"{task.instance_id}: {err}")
                continue
            for way, scripts in ways.items():
                scorer = SweScorer(factory, repos, run_scripts=scripts)
                gold, gold_reward = timed(scorer, task, task.patch, args.repeats)
                noop, noop_reward = timed(scorer, task, "", args.repeats)
                print(f"{task.instance_id[:60]:60s} {way:20s} {gold:7.2f} {gold_reward:6.1f} {noop:8.2f} {noop_reward:6.1f}",
                      flush=True)
    finally:
        repos.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
