"""Per-row SWE environments (env.sandbox.task_images: build): what building and scoring costs per row.

    python bench/swe_environments.py --rows ROWS.jsonl [--repos DIR] [--kind bubblewrap|podman]
                                     [--python-versions nearest|exact] [--timeout-s 900]

For every row of --rows (published SWE-bench rows; their repositories in --repos, default `repos/`
beside the rows, as bundles or clones), prints:
- the environment's build time cold (every layer built again from nothing) and cached (found again);
- the scoring time of the gold patch and of the no-op (an empty patch) on the built environment, and
  their rewards (1 and 0 for a sound row);
- the row's notes (a substituted Python, conda packages taken from PyPI) or the named cause of its
  failure (a repository not there, a build step that failed, a version the harness does not know).
Needs root, podman, the local base (tools/build_base_image.sh) and the `swe` extra.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dockyard.config.schema.env import SandboxConfig  # noqa: E402
from dockyard.envs.swe import SweScorer  # noqa: E402
from dockyard.envs.swe_environments import EnvironmentBuilder  # noqa: E402
from dockyard.envs.swe_tasks import RepoStore, SweTaskError, read_task_file  # noqa: E402
from dockyard.sandboxes.base import SandboxError  # noqa: E402
from dockyard.sandboxes.factory import SandboxFactory  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", required=True)
    parser.add_argument("--repos", default=None)
    parser.add_argument("--kind", choices=("bubblewrap", "podman"), default="bubblewrap")
    parser.add_argument("--python-versions", choices=("nearest", "exact"), default="nearest")
    parser.add_argument("--timeout-s", type=float, default=900)
    args = parser.parse_args()
    tasks, problems = read_task_file(args.rows)
    for problem in problems:
        print(f"unreadable row: {problem}")
    factory = SandboxFactory(SandboxConfig(type=args.kind, task_images="build", command_exec_timeout_s=args.timeout_s,
                                           memory_mb=4096, max_concurrent=1))
    repos = RepoStore(args.repos)
    print(f"{len(tasks)} rows, {args.kind}")
    print(f"{'row':36} {'cold s':>7} {'cached s':>8} {'gold':>5} {'gold s':>7} {'no-op':>5} {'no-op s':>7}  notes")
    try:
        for task in tasks:
            cold = EnvironmentBuilder(factory.images, repos, None, args.python_versions, rebuild=True)
            try:
                started = time.monotonic()
                cold.environment_for(task)
                cold_s = time.monotonic() - started
                cached = EnvironmentBuilder(factory.images, repos, None, args.python_versions)
                started = time.monotonic()
                row = cached.environment_for(task)
                cached_s = time.monotonic() - started
                scorer = SweScorer(factory, repos, "binary", True, cached)
                gold, noop = scorer.score(task, task.patch), scorer.score(task, "")
                print(f"{task.instance_id:36} {cold_s:7.1f} {cached_s:8.1f} {gold.reward:5.2f} {gold.seconds:7.1f} "
                      f"{noop.reward:5.2f} {noop.seconds:7.1f}  {'; '.join(row.notes)}", flush=True)
            except (SweTaskError, SandboxError) as err:
                print(f"{task.instance_id:36} {'-':>7} {'-':>8} {'-':>5} {'-':>7} {'-':>5} {'-':>7}  "
                      f"{' '.join(str(err).split())[:300]}", flush=True)
    finally:
        repos.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
