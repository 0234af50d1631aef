"""Task image figures (env.sandbox.task_images: build): what building and running on task images costs.

    python bench/task_images.py [--tasks DIR] [--kind bubblewrap|podman] [--base IMAGE] [--repeats 5]
                                [--agent oracle|noop] [--agent-user auto|root|sandbox]

Prints, for every task of --tasks (default: tests/envs/image_tasks, two tasks whose Dockerfiles use
RUN, heredocs, COPY --chown, ARG and WORKDIR):
- image build, cold (`--rebuild`: no cached layer) and cached (the second lookup);
- for bubblewrap, the export of the image's root folder (part of the cold figure);
- sandbox start on the built image: creating a sandbox until its first command has answered;
- a trial end to end on the built image: sandbox, the agent (oracle: the task's solution; noop for
  task sets without solutions), tests, reward;
- `dockyard env check --agent AGENT` over the whole set twice, first `--rebuild` (every image from
  nothing) and then with every image cached, and their ratio (cached builds must make the second at
  least 5x faster).
Needs root, podman and the local base (tools/build_base_image.sh).
"""

from __future__ import annotations

import argparse
import io
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dockyard.config.loader import load_config                          # noqa: E402
from dockyard.config.schema.env import SandboxConfig                      # noqa: E402
from dockyard.envs.check import EXPECTED, check                           # noqa: E402
from dockyard.envs.terminal_tasks import load_tasks                       # noqa: E402
from dockyard.envs.terminal_trial import AGENTS, run_trial, sandbox_spec  # noqa: E402
from dockyard.sandboxes.factory import SandboxFactory                     # noqa: E402

REPO = Path(__file__).resolve().parent.parent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", default=str(REPO / "tests" / "envs" / "image_tasks"))
    parser.add_argument("--kind", choices=["bubblewrap", "podman"], default="bubblewrap")
    parser.add_argument("--base", default="localhost/dockyard-base:bookworm")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--agent", choices=sorted(AGENTS), default="oracle")
    parser.add_argument("--agent-user", choices=["auto", "root", "sandbox"], default="auto",
                        help="env.sandbox.agent_user: root inside (the default on built images, as root) or the "
                             "unprivileged sandbox user, to compare what root inside costs")
    args = parser.parse_args()
    cache = Path(tempfile.mkdtemp(prefix="dockyard-bench-images-", dir="/var/tmp"))
    cache.chmod(0o755)
    config = SandboxConfig(type=args.kind, task_images="build", default_base_image=args.base, image_cache=str(cache),
                           agent_user=args.agent_user)
    factory = SandboxFactory(config)
    tasks = load_tasks(args.tasks)
    print(f"{len(tasks)} tasks from {args.tasks}, {args.kind} sandboxes (agent_user {args.agent_user}), base {args.base}")
    try:
        for task in tasks:
            cold = factory.task_image(task.name, task.dockerfile, task.build_context, rebuild=True)
            cached = [factory.task_image(task.name, task.dockerfile, task.build_context).seconds
                      for _ in range(args.repeats)]
            starts, trials = [], []
            for _ in range(args.repeats):
                started = time.perf_counter()
                sandbox = factory.create(sandbox_spec(task, cold))
                sandbox.run("true")
                starts.append(time.perf_counter() - started)
                sandbox.destroy()
                result = run_trial(task, factory.create, AGENTS[args.agent], image=cold)
                assert result.reward == EXPECTED[args.agent], (task.name, result.notes, result.test_output[-500:])
                trials.append(result.seconds)
            print(f"{task.name}: build cold {cold.seconds:.1f} s, cached {statistics.median(cached) * 1000:.0f} ms; "
                  f"sandbox start {statistics.median(starts) * 1000:.0f} ms; "
                  f"{args.agent} trial {statistics.median(trials) * 1000:.0f} ms (median of {args.repeats})")
        loaded = load_config(REPO / "configs" / "grpo_terminal_bench_local.yaml",
                             [f"env.sandbox.type={args.kind}", "env.sandbox.task_images=build",
                              f"env.sandbox.default_base_image={args.base}", f"env.sandbox.image_cache={cache}",
                              f"env.sandbox.agent_user={args.agent_user}"])
        times = []
        for rebuild in (True, False):   # from nothing (no cached layer), then with every image cached
            started = time.perf_counter()
            status = check(loaded.config, args.tasks, args.agent, out=io.StringIO(), logs=str(cache / "logs"),
                           rebuild=rebuild)
            times.append(time.perf_counter() - started)
            assert status == 0, f"the {args.agent} agent did not get {EXPECTED[args.agent]:.0f} on every task"
        print(f"env check --agent {args.agent}: cold {times[0]:.1f} s, cached {times[1]:.1f} s, "
              f"{times[0] / times[1]:.1f}x faster the second time")
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
