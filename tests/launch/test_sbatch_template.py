"""slurm/grpo_het.sbatch, the hand-written het template, runs grpo_tiny on the real local cluster
through the same entry point (jobs/grpo.py --slurm) and leaves a checkpoint."""

import json
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


def sbatch_template(tmp_path, template: str, *overrides: str) -> tuple[str, str]:
    """Run slurm/<template> with grpo_tiny and wait; returns (job id, the batch script's output)."""
    env = dict(os.environ, CONFIG="grpo_tiny.yaml", PYTHON=sys.executable, DOCKYARD_HOME=str(REPO),
               PYTHONPATH=str(REPO))
    result = subprocess.run(["sbatch", "--wait", "--parsable", f"--output={tmp_path}/job.out",
                             str(REPO / "slurm" / template), *overrides],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    output = (tmp_path / "job.out").read_text() if (tmp_path / "job.out").is_file() else ""
    assert result.returncode == 0, result.stderr + output
    return result.stdout.strip().split(";")[0], output


def test_sft_template_runs_the_sft_loop(slurm_cluster, tmp_path, tiny_model):
    from tests.run.test_sft_run import sft_overrides

    _, output = sbatch_template(tmp_path, "sft_het.sbatch", f"models_dir={tiny_model.parent}",
                                *sft_overrides(tmp_path, "sft.max_num_steps=2"))
    metrics = [json.loads(line) for line in
               (tmp_path / "runs" / "grpo_tiny" / "logs" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in metrics] == [1, 2] and "val/loss" in metrics[-1] and "data/trained_tokens" in metrics[0]
    assert (tmp_path / "runs" / "grpo_tiny" / "checkpoints" / "latest_checkpointed_iteration.txt").read_text().strip() == "2"


def test_teachers_template_runs_two_teacher_servers_on_het_group_2(slurm_cluster, tmp_path, tiny_model,
                                                                   teacher_models):
    from tests.run.test_distillation_run import OPD, opd_section

    rows = tmp_path / "p.jsonl"
    rows.write_text("".join(json.dumps({"input": f"{a} + 1", "label": str(a + 1)}) + "\n" for a in range(40)))
    job, output = sbatch_template(tmp_path, "teachers_het.sbatch", f"models_dir={tiny_model.parent}", *OPD,
                                  "cluster.teacher.num_nodes=1", opd_section(teacher_models),
                                  "grpo.filters.identical_reward=false", "grpo.max_num_steps=2",
                                  f"data.datasets=[{{name: p, path: {rows}}}]")
    folder = tmp_path / "runs" / f"slurm-{job}"
    assert len(list(folder.glob("*_teacher*_node4.log"))) == 2
    assert "started teacher alpha on node4" in output and "started teacher beta on node4" in output
    metrics = [json.loads(line) for line in
               (tmp_path / "runs" / "grpo_tiny" / "logs" / "metrics.jsonl").read_text().splitlines()]
    # no agent names here: every rollout goes to the first teacher
    assert [r["opd/rollouts_alpha"] for r in metrics] == [16.0, 16.0]
