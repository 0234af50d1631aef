"""The data plane (docs/data-plane.md): what it costs, and the dev-cluster scenario.

    .venv/bin/python bench/data_plane.py [--steps 20] [--cluster-steps 100] [--no-cluster]

1. Throughput on this machine, same run (grpo_tiny, async, one embedded engine, 2 trainer ranks):
   trajectories per second through the in-memory path (`grpo_tiny` async) and through the plane
   (`grpo_tiny_plane` + one `dockyard rollout-worker`), over the steps after the first.
2. The broker's overhead per trajectory: a real group's JSON size, and the time of the plane's round
   trip (worker: XADD group + XACK prompt in one transaction; trainer: XREADGROUP, then the settle
   script) against a local redis-server.
3. On the dev cluster (slurm/dev-cluster/start.sh; skipped with --no-cluster): the trainer's job plus
   2 rollout-worker jobs; after step 3 one worker is scancelled and another submitted; the trainer
   goes on to the last step. Ends with the run's accounting:

   produced P = trained T + stale S + in flight F; lost L; workers joined J, left K
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _run import REPO  # noqa: E402

ASYNC = ["grpo.async_grpo.enabled=true", "grpo.async_grpo.max_staleness_steps=1",
         "loss_fn.is_correction.enabled=true", "loss_fn.is_correction.lower_bound=0.5",
         "loss_fn.is_correction.upper_bound=2.0"]
ACCOUNTING = re.compile(r"produced (\d+) = trained (\d+) \+ stale (\d+) \+ duplicate (\d+) \+ in flight (\d+); "
                        r"lost (-?\d+); workers joined (\d+), left (\d+)")


def _cli(command: str, config: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "dockyard.cli", command, "--config", config, f"models_dir={REPO / 'models'}", *args]


def _metrics(folder: Path) -> list[dict]:
    path = next(folder.glob("runs/*/logs/metrics.jsonl"))
    return [json.loads(line) for line in path.read_text().splitlines()]


def _trajectories_per_s(rows: list[dict]) -> float:
    later = rows[1:]
    return 16 * len(later) / sum(r["time/step"] for r in later)


def in_memory(steps: int) -> float:
    folder = Path(tempfile.mkdtemp(prefix="dockyard-plane-bench-"))
    subprocess.run(_cli("run", "grpo_tiny.yaml", f"grpo.max_num_steps={steps}", "checkpointing.enabled=false",
                        *ASYNC), cwd=folder, check=True, capture_output=True)
    return _trajectories_per_s(_metrics(folder))


def through_the_plane(steps: int) -> tuple[float, str]:
    folder = Path(tempfile.mkdtemp(prefix="dockyard-plane-bench-"))
    trainer = subprocess.Popen(_cli("run", "grpo_tiny_plane.yaml", f"grpo.max_num_steps={steps}",
                                    f"checkpointing.save_period={steps}"), cwd=folder, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, start_new_session=True)
    worker = subprocess.Popen(_cli("rollout-worker", "grpo_tiny_plane.yaml"), cwd=folder, stdout=subprocess.DEVNULL,
                              stderr=subprocess.STDOUT, start_new_session=True)
    try:
        output, _ = trainer.communicate(timeout=1800)
        worker.wait(timeout=120)
    finally:
        for process in (trainer, worker):
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
    if trainer.returncode != 0:
        sys.exit(output[-3000:])
    return _trajectories_per_s(_metrics(folder)), ACCOUNTING.search(output).group(0)


def broker_overhead(rounds: int = 200) -> tuple[float, float]:
    """Bytes and milliseconds per trajectory of the plane's own traffic, for a grpo_tiny-sized group."""
    from dockyard.config import load_config
    from dockyard.data.datasets import Prompt
    from dockyard.distributed import free_port
    from dockyard.loop.rollouts import Group, Trajectory
    from dockyard.plane.broker import Broker
    from dockyard.plane.feed import GROUPS, PROMPTS, TRAINER, WORKERS, ensure_groups, _SETTLE
    from dockyard.plane.messages import encode_trajectories
    from dockyard.policy.samples import Sample

    port, folder = free_port(), Path(tempfile.mkdtemp(prefix="dockyard-plane-broker-"))
    server = subprocess.Popen(["redis-server", "--port", str(port), "--dir", str(folder), "--appendonly", "yes",
                               "--appendfsync", "always", "--save", ""], stdout=subprocess.DEVNULL)
    try:
        cfg = load_config("grpo_tiny_plane.yaml", [f"models_dir={REPO / 'models'}", "data_plane.start=false",
                                                   f"data_plane.address=127.0.0.1:{port}"]).config
        time.sleep(0.5)
        b = Broker(cfg)
        ensure_groups(b)
        settle = b.redis.register_script(_SETTLE)
        # 4 samples of a 40-token prompt and 16 sampled tokens, with logprobs: grpo_tiny's shape
        group = Group(Prompt("1+1", "2", {}, "arithmetic"), [Trajectory(Sample(
            list(range(56)), 40, loss_mask=[1] * 16, rollout_logprobs=[-1.2345678] * 16), 1.0, 1.0,
            versions=[3] * 16) for _ in range(4)])
        payload = encode_trajectories(group)
        started = time.perf_counter()
        for n in range(rounds):
            prompt_id = b.redis.xadd(b.key(PROMPTS), {"n": n, "row": 0, "seed": 0, "prompt": "{}"})
            b.redis.xreadgroup(WORKERS, "w", {b.key(PROMPTS): ">"}, count=1)
            pipe = b.redis.pipeline(transaction=True)
            pipe.xadd(b.key(GROUPS), {"n": n, "row": 0, "version": 3, "worker": "w", "seconds": 0.1,
                                      "trajectories": payload})
            pipe.xack(b.key(PROMPTS), WORKERS, prompt_id)
            pipe.xdel(b.key(PROMPTS), prompt_id)
            pipe.execute()
            got = b.redis.xreadgroup(TRAINER, "trainer", {b.key(GROUPS): ">"}, count=1)
            entry = got[0][1][0][0]
            settle(keys=[b.key(GROUPS), b.key("counters"), b.key("outstanding")], args=[TRAINER, "trained", 1, entry, n])
        seconds = time.perf_counter() - started
        return len(payload.encode()) / 4, 1000 * seconds / (rounds * 4)
    finally:
        server.kill()


def cluster_scenario(steps: int) -> str:
    """The trainer's job + 2 worker jobs; one scancelled after step 3, one more submitted; the accounting."""
    folder = Path(tempfile.mkdtemp(prefix="dockyard-plane-cluster-"))
    submit = [sys.executable, "-c", "import sys; from dockyard.cli import submit_main; sys.exit(submit_main())",
              "--config", "grpo_tiny_plane.yaml", "--nodes", "2", f"models_dir={REPO / 'models'}",
              f"cluster.slurm.folder={folder}/slurm", f"grpo.max_num_steps={steps}", "data_plane.claim_after_s=30"]
    out = subprocess.run([*submit, "--rollout-workers", "2"], cwd=folder, capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        sys.exit(out.stdout + out.stderr)
    trainer = re.search(r"submitted job (\d+)", out.stdout).group(1)
    workers = re.findall(r"\d+", out.stdout.split("rollout-worker job(s):", 1)[1].splitlines()[0])
    metrics = folder / "runs" / "grpo_tiny_plane" / "logs" / "metrics.jsonl"
    deadline = time.monotonic() + 900
    while not (metrics.is_file() and len(metrics.read_text().splitlines()) >= 3):
        if time.monotonic() > deadline:
            sys.exit(f"no 3 steps in 900 s (job {trainer})")
        time.sleep(1)
    subprocess.run(["scancel", workers[0]], check=True)
    more = subprocess.run([*submit, "--rollout-workers", "1", "--workers-only"], cwd=folder, capture_output=True,
                          text=True, timeout=300)
    workers += re.findall(r"\d+", more.stdout.split("rollout-worker job(s):", 1)[1].splitlines()[0])
    while True:
        state = subprocess.run(["sacct", "-j", trainer, "-X", "-n", "-P", "-o", "State"], capture_output=True,
                               text=True).stdout.split()
        if state and state[0] in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"):
            break
        time.sleep(3)
    subprocess.run(["scancel", *workers])
    log = (folder / "slurm" / f"{trainer}_0_log.err").read_text()
    found = ACCOUNTING.findall(log)
    if not found:
        sys.exit(f"job {trainer} ended {state[0]} without the plane's accounting:\n{log[-3000:]}")
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    print(f"cluster: {len(rows)} steps, {statistics.mean(r['plane/groups_per_s'] for r in rows[1:]):.2f} groups/s, "
          f"fleet size per step {[int(r['plane/workers']) for r in rows]}")
    produced, trained, stale, duplicate, in_flight, lost, joined, left = map(int, found[-1])
    return (f"produced {produced} = trained {trained} + stale {stale + duplicate} + in flight {in_flight}; "
            f"lost {lost}; workers joined {joined}, left {left}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--cluster-steps", type=int, default=100,
                        help="steps of the dev-cluster scenario: enough for the added worker to start and join")
    parser.add_argument("--no-cluster", action="store_true")
    args = parser.parse_args()
    memory = in_memory(args.steps)
    plane, accounting = through_the_plane(args.steps)
    print(f"trajectories/s, grpo_tiny async, {args.steps} steps: in-memory {memory:.1f}, data plane {plane:.1f} "
          f"({plane / memory:.2f}x); local run: {accounting}")
    size, ms = broker_overhead()
    print(f"broker overhead per trajectory: {size:.0f} bytes of JSON, {ms:.2f} ms round trip "
          "(push + ack + read + settle, append-only file fsynced on every write)")
    if not args.no_cluster:
        print(cluster_scenario(args.cluster_steps))


if __name__ == "__main__":
    main()
