"""The Slurm half of the preflight, against the real local cluster: what sinfo / scontrol / sacctmgr
say refuses a job before it is queued, naming the setting."""

import subprocess

import pytest

from tests.launch.conftest import run_submit

GPUS_8 = ("cluster.gpus_per_node=8", "grpo.num_prompts_per_step=16", "data.datasets.0.num_prompts_per_step=16",
          "policy.train_micro_batch_size=1", "policy.train_global_batch_size=64")


@pytest.fixture
def high_partition_limits(slurm_cluster):
    """The `high` partition with a 10-minute and 1-node-per-job limit, restored afterwards."""
    subprocess.run(["scontrol", "update", "PartitionName=high", "MaxTime=10", "MaxNodes=1"], check=True, timeout=30)
    yield
    subprocess.run(["scontrol", "update", "PartitionName=high", "MaxTime=UNLIMITED", "MaxNodes=UNLIMITED"],
                   check=True, timeout=30)


CASES = {
    "no such partition": (["--partition", "gpu-a100"], "cluster.slurm.partition: no partition 'gpu-a100' on this "
                          "cluster; partitions: normal, high"),
    "more nodes than the partition": (["--nodes", "5"], "cluster.num_nodes: the job needs 5 nodes but partition "
                                      "'normal' has 4"),
    "more GPUs per node than its nodes": (list(GPUS_8), "cluster.gpus_per_node: 8 GPUs per node asked for, but the "
                                          "nodes of partition 'normal' have at most 4"),
    "an account that is not the user's": (["--account", "physics"], "cluster.slurm.account: user root has no "
                                          "association with account 'physics'; theirs: root"),
    "a QOS that is not allowed": (["--qos", "premium"], "cluster.slurm.qos: QOS 'premium' is not allowed for user "
                                  "root; allowed: normal"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_job_the_cluster_would_refuse_is_not_queued(slurm_cluster, tiny_model, tmp_path, case):
    args, expected = CASES[case]
    if "root" in expected and subprocess.run(["id", "-un"], capture_output=True, text=True).stdout.strip() != "root":
        pytest.skip("the expected text names the root user")
    result = run_submit(tmp_path, tiny_model, "--dry-run", *args)
    assert result.returncode == 2, result.stdout + result.stderr
    assert expected in result.stderr and "nothing was submitted" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


def test_the_partition_time_and_node_limits_are_checked(high_partition_limits, tiny_model, tmp_path):
    result = run_submit(tmp_path, tiny_model, "--dry-run", "--partition", "high", "--time", "30")
    assert result.returncode == 2, result.stderr
    assert "cluster.slurm.time: 30 is over partition 'high''s limit of 00:10:00" in result.stderr, result.stderr
    assert "cluster.num_nodes: the trainer component asks for 2 nodes; partition 'high' allows 1 per job" \
        in result.stderr
    assert run_submit(tmp_path, tiny_model, "--dry-run", "--time", "30").returncode == 0   # normal: no limits


def test_a_gpu_job_says_the_cuda_check_is_left_to_the_compute_nodes(slurm_cluster, tiny_model, tmp_path):
    result = run_submit(tmp_path, tiny_model, "--dry-run", "cluster.gpus_per_node=2", "policy.train_micro_batch_size=1",
                        "policy.train_global_batch_size=16")
    assert "preflight skipped: CUDA devices and drivers: only the compute nodes can check them" in result.stderr, \
        result.stdout + result.stderr
