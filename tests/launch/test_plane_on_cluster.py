"""The data plane on the real local Slurm cluster: `dockyard-submit --rollout-workers 2` queues the
trainer's job (2 trainer nodes, the broker on rank 0's node) and two rollout-worker jobs of one node
each. Held after step 3 (holding.py: the workers' reward waits), one worker job is `scancel`led and
another is submitted through slurm/rollout_worker.sbatch; the run goes on to its last step, and every group the
workers produced is accounted for."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from dockyard.waiting import wait_until
from tests.conftest import REPO
from tests.launch.conftest import run_submit
from tests.launch.holding import hold_after, hold_overrides, is_holding, release
from tests.launch.jobs import job_state, wait_ended

STEPS = 10
PLANE = ("--config", "grpo_tiny_plane.yaml", "--nodes", "2", "data_plane.claim_after_s=30", "data_plane.timeout_s=240")


def _jobs(output: str) -> list[str]:
    return re.findall(r"\b(\d+)\b", output.split("rollout-worker job(s):", 1)[1].splitlines()[0])


def _counters(workdir: Path) -> dict[str, int]:
    import redis

    plane = workdir / "runs" / "grpo_tiny_plane" / "checkpoints" / "data_plane"
    host, port = (plane / "broker.address").read_text().strip().rsplit(":", 1)
    client = redis.Redis(host=host, port=int(port), password=(plane / "broker.secret").read_text().strip(),
                         decode_responses=True, socket_timeout=5)
    try:
        return {k: int(v) for k, v in client.hgetall("dockyard:grpo_tiny_plane:counters").items()}
    finally:
        client.close()


def _joined(workdir: Path) -> int:
    try:
        return _counters(workdir).get("joined", 0)
    except Exception:   # the broker is not up yet
        return 0


def test_a_trainer_job_and_worker_jobs_that_come_and_go(slurm_cluster, tmp_path, tiny_model):
    hold = hold_overrides(tmp_path, "grpo_tiny_plane")
    hold_after(tmp_path, 3)
    submitted = run_submit(tmp_path, tiny_model, *PLANE, "--rollout-workers", "2", f"grpo.max_num_steps={STEPS}", *hold)
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    trainer = re.search(r"submitted job (\d+)", submitted.stdout).group(1)
    first, second = _jobs(submitted.stdout)
    third = None
    try:
        wait_until(lambda: is_holding(tmp_path, 3), 600, "the run to hold after step 3")
        wait_until(lambda: _joined(tmp_path) == 2, 300, "both workers to join the plane")
        subprocess.run(["scancel", first], check=True, timeout=30)   # what a preemption of a worker job sends
        # the third through the hand-written template, on the run's resolved config
        env = dict(os.environ, CONFIG="runs/grpo_tiny_plane/logs/config.yaml", PYTHON=sys.executable,
                   DOCKYARD_HOME=str(REPO))
        more = subprocess.run(["sbatch", "--parsable", f"--output={tmp_path}/third.out",
                               str(REPO / "slurm" / "rollout_worker.sbatch")], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=60)
        assert more.returncode == 0, more.stderr
        third = more.stdout.strip().split(";")[0]
        wait_until(lambda: _joined(tmp_path) == 3, 300, "the third worker to join the plane")
        release(tmp_path, 3)
        assert wait_ended(trainer, 600) == "COMPLETED"
        for job in (second, third):   # they leave once the run has finished
            assert wait_ended(job, 300) == "COMPLETED", job
        assert "the run has finished; leaving" in (tmp_path / "third.out").read_text()
        assert job_state(first) == "CANCELLED"
    finally:
        subprocess.run(["scancel", trainer, first, second, *([third] if third else [])], timeout=30)
    log = (tmp_path / "slurm" / f"{trainer}_0_log.err").read_text()
    found = re.findall(r"produced (\d+) = trained (\d+) \+ stale (\d+) \+ duplicate (\d+) \+ in flight (\d+); "
                       r"lost (-?\d+); workers joined (\d+), left (\d+)", log)
    assert found, log[-3000:]
    produced, trained, stale, duplicate, in_flight, lost, joined, left = map(int, found[-1])
    assert lost == 0 and trained == STEPS * 4 and joined == 3, found[-1]
    rows = [json.loads(line) for line in
            (tmp_path / "runs" / "grpo_tiny_plane" / "logs" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    trained_rows = [row for r in rows for row in r["async/prompt_rows"]]
    assert len(set(trained_rows)) == len(trained_rows)
    assert max(r["plane/workers"] for r in rows) == 2
    # the broker ran on trainer rank 0's node
    rank0 = re.search(r"trainer rank 0/2 on (node\d)", log).group(1)
    assert f"data plane broker (redis-server) at {rank0}:" in log
