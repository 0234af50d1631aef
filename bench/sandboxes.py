"""Sandbox figures: what a bubblewrap sandbox costs.

    python bench/sandboxes.py [--kind bubblewrap|podman] [--commands 50] [--memory-gb 8] [--max 64]

Prints:
- start: creating a sandbox (workspace, task files) until its first command has answered;
- per-command overhead: a fresh `run` and a command in a persistent shell session, against the
  same command as a plain subprocess on the host;
- a trial end to end: a shipped terminal task's sandbox, its oracle solution, the tests and the
  reward (`run_trial`), over --trials tasks of tasks/terminal_bench/;
- concurrency: how many sandboxes, each with a live shell running a small Python process, are up
  at once on this machine, and the memory they take (resident set of their processes), against a
  budget of --memory-gb.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dockyard.envs.terminal_tasks import load_tasks              # noqa: E402
from dockyard.envs.terminal_trial import oracle_agent, run_trial  # noqa: E402
from dockyard.sandboxes.base import SandboxLimits, SandboxSpec   # noqa: E402
from dockyard.sandboxes.bubblewrap import BubblewrapSandbox      # noqa: E402
from dockyard.sandboxes.podman import PodmanSandbox              # noqa: E402

KINDS = {"bubblewrap": BubblewrapSandbox, "podman": PodmanSandbox}

COMMAND = "cat data/input.txt > /dev/null; echo ok"


def median_ms(samples: list[float]) -> str:
    return f"{statistics.median(samples) * 1000:.1f} ms (p90 {sorted(samples)[int(len(samples) * 0.9)] * 1000:.1f})"


def rss_kb(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except FileNotFoundError:
            pass
    return total


def descendants(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-e", "-o", "pid=,ppid="], capture_output=True, text=True).stdout.split()
    children: dict[int, list[int]] = {}
    for child, parent in zip(out[::2], out[1::2]):
        children.setdefault(int(parent), []).append(int(child))
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo += children.get(current, [])
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kind", choices=sorted(KINDS), default="bubblewrap")
    parser.add_argument("--commands", type=int, default=50)
    parser.add_argument("--memory-gb", type=float, default=8.0)
    parser.add_argument("--max", type=int, default=64)
    parser.add_argument("--trials", type=int, default=12, help="shipped terminal tasks run end to end")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="dockyard-bench-"))
    (folder / "input.txt").write_text("x" * 10_000)
    spec = SandboxSpec(workdir="/app", files=[(folder / "input.txt", "/app/data/input.txt")])
    limits = SandboxLimits(command_timeout_s=60)
    Sandbox = KINDS[args.kind]
    print(f"{args.kind} sandboxes")

    starts = []
    for _ in range(10):
        began = time.perf_counter()
        with Sandbox(spec, limits) as box:
            assert box.run(COMMAND).output.strip() == "ok"
            starts.append(time.perf_counter() - began)
    print(f"start + first command:      {median_ms(starts)}")

    plain, fresh, session = [], [], []
    for _ in range(args.commands):
        began = time.perf_counter()
        subprocess.run(["bash", "-c", COMMAND], cwd=folder, capture_output=True, check=False)
        plain.append(time.perf_counter() - began)
    with Sandbox(spec, limits) as box:
        shell = box.shell()
        shell.run("true")
        for _ in range(args.commands):
            began = time.perf_counter()
            box.run(COMMAND)
            fresh.append(time.perf_counter() - began)
            began = time.perf_counter()
            shell.run(COMMAND)
            session.append(time.perf_counter() - began)
    print(f"plain subprocess:           {median_ms(plain)}")
    print(f"sandbox run (fresh):        {median_ms(fresh)}  overhead "
          f"{(statistics.median(fresh) - statistics.median(plain)) * 1000:+.1f} ms")
    print(f"sandbox shell session:      {median_ms(session)}  overhead "
          f"{(statistics.median(session) - statistics.median(plain)) * 1000:+.1f} ms")

    tasks = load_tasks(Path(__file__).resolve().parent.parent / "tasks" / "terminal_bench")[:args.trials]
    trials = []
    for task in tasks:
        began = time.perf_counter()
        result = run_trial(task, lambda spec: Sandbox(spec, limits), oracle_agent)
        trials.append(time.perf_counter() - began)
        assert result.reward == 1.0, (task.name, result.error, result.test_output[-500:])
    print(f"trial end to end (oracle):  {median_ms(trials)} over {len(trials)} shipped tasks, "
          f"{sum(trials):.2f} s in all")

    budget_kb = args.memory_gb * 1024 * 1024
    boxes, live = [], 0
    try:
        while live < args.max:
            box = Sandbox(spec, limits)
            boxes.append(box)
            shell = box.shell()
            shell.run("python3 -c 'import time' && echo up")   # a shell and a short Python start in each
            live += 1
            used = rss_kb([pid for b in boxes for s in b._shells if s.process for pid in descendants(s.process.pid)])
            if used > budget_kb:
                break
        used = rss_kb([pid for b in boxes for s in b._shells if s.process for pid in descendants(s.process.pid)])
        print(f"concurrent sandboxes:       {live} up with a live shell each, {used / 1024:.0f} MB resident "
              f"({used / live / 1024:.1f} MB each); {int(budget_kb / max(used / live, 1))} would fit in "
              f"{args.memory_gb:g} GB (stopped at --max {args.max})" if live == args.max else
              f"concurrent sandboxes:       {live} before {args.memory_gb:g} GB was used")
    finally:
        for box in boxes:
            box.destroy()
    return 0


if __name__ == "__main__":
    sys.exit(main())
