"""slurm/grpo_het.sbatch, the hand-written het template, runs grpo_tiny on the real local cluster
through the same entry point (jobs/grpo.py --slurm) and leaves a checkpoint."""

import os
import subprocess
import sys

from tests.conftest import REPO


def test_hand_written_template_trains_grpo_tiny(slurm_cluster, tmp_path, tiny_model):
    env = dict(os.environ, CONFIG="grpo_tiny.yaml", PYTHON=sys.executable, DOCKYARD_HOME=str(REPO),
               PYTHONPATH=str(REPO))
    result = subprocess.run(["sbatch", "--wait", "--parsable", f"--output={tmp_path}/job.out",
                             str(REPO / "slurm" / "grpo_het.sbatch"), f"models_dir={tiny_model.parent}"],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    output = (tmp_path / "job.out").read_text() if (tmp_path / "job.out").is_file() else ""
    assert result.returncode == 0, result.stderr + output
    job = result.stdout.strip().split(";")[0]
    folder = tmp_path / "runs" / f"slurm-{job}"
    assert (folder / "config.yaml").is_file()
    assert any(folder.glob("*_rollout0_node3.log"))
    checkpoints = tmp_path / "runs" / "grpo_tiny" / "checkpoints"
    assert (checkpoints / "latest_checkpointed_iteration.txt").read_text().strip() == "4"
    assert "trainer rank 0/2 on node1" in output


def test_template_refuses_a_config_that_does_not_fit_the_allocation(slurm_cluster, tmp_path, tiny_model):
    env = dict(os.environ, CONFIG="grpo_tiny.yaml", PYTHON=sys.executable, DOCKYARD_HOME=str(REPO),
               PYTHONPATH=str(REPO))
    result = subprocess.run(["sbatch", "--wait", f"--output={tmp_path}/job.out",
                             str(REPO / "slurm" / "grpo_het.sbatch"), f"models_dir={tiny_model.parent}",
                             "cluster.rollout.num_nodes=3"],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode != 0
    assert "cluster.trainer.num_nodes" in (tmp_path / "job.out").read_text()


def test_vllm_template_runs_two_vllm_replicas(slurm_cluster, tmp_path, tiny_model):
    from tests.conftest import require_vllm

    require_vllm()
    env = dict(os.environ, CONFIG="grpo_tiny.yaml", PYTHON=sys.executable, DOCKYARD_HOME=str(REPO),
               PYTHONPATH=str(REPO))
    result = subprocess.run(["sbatch", "--wait", "--parsable", f"--output={tmp_path}/job.out",
                             str(REPO / "slurm" / "grpo_vllm_het.sbatch"), f"models_dir={tiny_model.parent}",
                             "grpo.max_num_steps=2"],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    output = (tmp_path / "job.out").read_text() if (tmp_path / "job.out").is_file() else ""
    assert result.returncode == 0, result.stderr + output
    job = result.stdout.strip().split(";")[0]
    folder = tmp_path / "runs" / f"slurm-{job}"
    for index in (0, 1):
        assert "Route: /v1/completions" in next(folder.glob(f"*_rollout{index}_node3.log")).read_text()
        assert f"refit of rollout server {index} on node node3" in output
    checkpoints = tmp_path / "runs" / "grpo_tiny" / "checkpoints"
    assert (checkpoints / "latest_checkpointed_iteration.txt").read_text().strip() == "2"
