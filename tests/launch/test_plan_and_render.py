import re
"""Planning `--nodes` into het components and rendering the sbatch script (no cluster needed for
most; `sbatch --test-only` checks the rendered script against the real local Slurm when it is up)."""

import subprocess

import pytest

from dockyard.config import load_config
from dockyard.launch.executor import HetSlurmInfoWatcher
from dockyard.config.job_plan import JobPlan, plan_job
from dockyard.config.slurm_time import SlurmTimeError, minutes, sbatch_time
from dockyard.launch.submit import build_executor
from tests.conftest import problems_of
from tests.launch.conftest import run_submit


def plan_of(config, *overrides):
    return plan_job(load_config(config, list(overrides)).config)


def test_grpo_tiny_on_three_nodes_is_two_trainer_nodes_and_one_rollout_node():
    plan = plan_of("grpo_tiny.yaml", "cluster.num_nodes=3")
    trainer, rollout = plan.components
    assert (trainer.role, trainer.nodes, trainer.tasks_per_node, trainer.het_group) == ("trainer", 2, 1, 0)
    assert (rollout.role, rollout.nodes, rollout.tasks_per_node, rollout.het_group) == ("rollout", 1, 1, 1)
    assert plan.server_group("rollout").overlap is False
    assert JobPlan.from_dict(plan.to_dict()) == plan


def test_nodes_go_to_the_trainer_after_rollout_and_teacher():
    plan = plan_of("grpo_terminal_bench.yaml", "cluster.num_nodes=6", "cluster.trainer.num_nodes=null")
    trainer, rollout = plan.components
    assert trainer.nodes == 6 - rollout.nodes
    assert trainer.tasks_per_node == 8
    # one server per rollout_gpus_per_replica GPUs
    cfg = load_config("grpo_terminal_bench.yaml", ["cluster.num_nodes=6", "cluster.trainer.num_nodes=null"]).config
    assert rollout.tasks_per_node == cfg.cluster.gpus_per_node // cfg.cluster.rollout_gpus_per_replica


def test_colocated_run_is_one_component_with_overlapping_servers():
    plan = plan_of("grpo_math_smol.yaml")
    assert [c.role for c in plan.components] == ["trainer"]
    assert plan.server_group("rollout").overlap


def test_too_few_nodes_is_a_config_error_before_submission(tmp_path, tiny_model):
    # rollout takes 1 node of grpo_tiny; with --nodes 1 the trainer would get none
    result = run_submit(tmp_path, tiny_model, "--nodes", "1", "--dry-run")
    assert result.returncode == 2, result.stderr
    assert "cluster.trainer.num_nodes" in result.stderr and "nothing was submitted" in result.stderr


def test_several_generation_servers_are_planned_on_the_rollout_component(tmp_path, tiny_model):
    result = run_submit(tmp_path, tiny_model, "--nodes", "4", "cluster.rollout.num_nodes=2",
                        "cluster.rollout.tasks_per_node=2", "--dry-run")
    assert result.returncode == 0, result.stderr
    assert re.search(r"^1\s+rollout\s+2\s+2\s+0\s+embedded generation servers$", result.stdout, re.M), result.stdout


def test_sglang_on_cpu_is_refused_at_submit_time(tmp_path, tiny_model):
    result = run_submit(tmp_path, tiny_model, "--nodes", "3", "generation=sglang", "--dry-run")
    assert result.returncode == 2
    assert "policy.generation.backend: sglang needs GPUs (cluster.gpus_per_node > 0)" in result.stderr


def test_missing_model_is_refused_at_submit_time(tmp_path, tiny_model):
    result = run_submit(tmp_path, tiny_model, "--nodes", "3", "policy.model_name=/nowhere/model", "--dry-run")
    assert result.returncode == 2 and "policy.model_name" in result.stderr


def test_slurm_time_formats():
    assert minutes(90) == 90 and minutes("90") == 90 and minutes("1:30:00") == 90
    assert minutes("2-00:00:00") == 2880 and minutes("1-12") == 2160 and minutes("10:30") == 10.5
    assert sbatch_time("2-01:00:00") == "2-01:00:00" and sbatch_time(61) == "01:01:00"
    with pytest.raises(SlurmTimeError):
        minutes("an hour")
    assert any(p.startswith("cluster.slurm.time") for p in problems_of("grpo_tiny.yaml", "cluster.slurm.time=soon"))
    assert any(p.startswith("cluster.slurm.signal_delay_s")
               for p in problems_of("grpo_tiny.yaml", "cluster.slurm.time=2", "cluster.slurm.signal_delay_s=300"))


def render(config, *overrides):
    cfg = load_config(config, list(overrides)).config
    plan = plan_job(cfg)
    executor = build_executor(cfg, plan, __import__("pathlib").Path("/shared/jobs"), require_slurm=False)
    return executor._make_submission_file_text(executor._submitit_command_str, "test")


def sbatch_blocks(script: str) -> list[list[str]]:
    """The #SBATCH lines of each het component, split at the `#SBATCH hetjob` separators."""
    blocks = [[]]
    for line in script.splitlines():
        if line == "#SBATCH hetjob":
            blocks.append([])
        elif line.startswith("#SBATCH "):
            blocks[-1].append(line.removeprefix("#SBATCH "))
    return blocks


def test_rendered_script_has_one_component_per_group_with_its_resources():
    script = render("grpo_terminal_bench.yaml", "cluster.num_nodes=4", "cluster.slurm.partition=gpu",
                    "cluster.slurm.account=proj7", "cluster.slurm.qos=high", "cluster.slurm.time=2-00:00:00",
                    "cluster.slurm.constraint=h100", "cluster.slurm.exclusive=true", "cluster.slurm.mem=200G",
                    "cluster.slurm.setup=[module load cuda/12.4,source /opt/venv/bin/activate]",
                    "cluster.container.runtime=pyxis", "cluster.container.image=/images/dockyard.sqsh",
                    "env.sandbox.type=none", "env.sandbox.trusted=true",
                    "cluster.container.mounts=[/data:/data:ro]", "cluster.slurm.signal_delay_s=300")
    trainer, rollout = sbatch_blocks(script)
    for block in (trainer, rollout):
        for flag in ("--partition=gpu", "--account=proj7", "--qos=high", "--time=2880", "--constraint=h100",
                     "--exclusive", "--mem=200G", "--gpus-per-node=8"):
            assert flag in block, (flag, block)
    assert "--nodes=2" in trainer and "--ntasks-per-node=8" in trainer
    assert "--signal=USR2@300" in trainer and "--requeue" in trainer
    assert "--nodes=2" in rollout and "--ntasks-per-node=4" in rollout
    assert any(line.startswith("--output=/shared/jobs/%j_0_log.out") for line in trainer)
    body = script.split("# setup", 1)[1]
    assert "module load cuda/12.4" in body and "source /opt/venv/bin/activate" in body
    srun = next(line for line in script.splitlines() if line.startswith("srun "))
    assert "--het-group=0" in srun and "--kill-on-bad-exit=1" in srun
    assert "--container-image=/images/dockyard.sqsh" in srun and "--container-mounts=/data:/data:ro," in srun
    # the image's Python runs the trainer task, through the environment filter, started guarded
    assert ("env --block-signal=USR2 --block-signal=TERM /opt/dockyard/venv/bin/python -m "
            "dockyard.launch.container_entry --keep=") in srun
    assert srun.endswith("-- /opt/dockyard/venv/bin/python -u -m submitit.core._submit /shared/jobs")


def test_gres_flag_and_a_colocated_job_without_hetjob():
    blocks = sbatch_blocks(render("grpo_terminal_bench.yaml", "cluster.num_nodes=4", "cluster.slurm.gpu_flag=gres"))
    assert all("--gres=gpu:8" in block for block in blocks)
    script = render("grpo_math_smol.yaml")
    assert "#SBATCH hetjob" not in script and "--het-group" not in script


def test_dry_run_prints_the_plan_and_the_script_and_submits_nothing(tmp_path, tiny_model):
    result = run_submit(tmp_path, tiny_model, "--nodes", "3", "--dry-run")
    assert result.returncode == 0, result.stderr
    assert "#SBATCH hetjob" in result.stdout and "het group" in result.stdout
    assert "rollout" in result.stdout and "nothing was submitted" in result.stderr
    assert not (tmp_path / "slurm").exists()


def test_rendered_script_is_accepted_by_sbatch(slurm_cluster, tmp_path, tiny_model):
    result = run_submit(tmp_path, tiny_model, "--nodes", "3", "--dry-run")
    script = result.stdout.split("sbatch script:\n", 1)[1].lstrip()
    (tmp_path / "job.sh").write_text(script)
    check = subprocess.run(["sbatch", "--test-only", str(tmp_path / "job.sh")], capture_output=True, text=True,
                           timeout=60)
    assert check.returncode == 0, check.stderr
    assert "to start at" in check.stderr


def test_sacct_rows_of_a_het_job_map_to_the_leader():
    watcher = HetSlurmInfoWatcher(delay_s=5)
    info = watcher.read_info("JobID|State|NodeList\n12+0|FAILED|node[1-2]\n12+0.batch|FAILED|node1\n"
                             "12+1|CANCELLED|node3\n13|RUNNING|node4\n")
    assert info["12"]["State"] == "FAILED" and info["13"]["State"] == "RUNNING"
    assert set(info) == {"12", "13"}


def test_a_data_plane_run_is_the_trainer_alone_and_its_workers_are_one_node_jobs_of_their_own(tmp_path, tiny_model):
    (trainer,) = plan_of("grpo_tiny_plane.yaml").components   # no rollout component: workers are jobs apart
    assert (trainer.role, trainer.nodes) == ("trainer", 2)
    result = run_submit(tmp_path, tiny_model, "--config", "grpo_tiny_plane.yaml", "--nodes", "2", "--dry-run",
                        "--rollout-workers", "3", "--worker-partition", "scavenge")
    assert result.returncode == 0, result.stderr
    trainer_script, worker_script = result.stdout.split("sbatch script:\n", 1)[1].split(
        "sbatch script of each of the 3 rollout-worker job(s):\n")
    assert "#SBATCH hetjob" not in trainer_script and "#SBATCH --nodes=2" in trainer_script
    assert "#SBATCH --nodes=1" in worker_script and "#SBATCH --partition=scavenge" in worker_script
    assert "#SBATCH --job-name=grpo_tiny_plane-rollout" in worker_script
    assert "nothing was submitted" in result.stderr and not (tmp_path / "slurm").exists()
    refused = run_submit(tmp_path, tiny_model, "--nodes", "3", "--dry-run", "--rollout-workers", "1")
    assert refused.returncode == 2
    assert "data_plane: --rollout-workers / --workers-only: rollout-worker jobs join a data-plane run" in refused.stderr
