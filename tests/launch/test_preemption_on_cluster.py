"""Preemption-safe training on the real local Slurm cluster: a run that is preempted (a high-priority
job takes every node) and then requeued ends in the state of an uninterrupted run. The requeues that
take no other job's nodes are in test_requeue_on_cluster.py."""

import json
import os
import random
import re
import subprocess
import time
from pathlib import Path

import pytest
import torch
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from dockyard.waiting import wait_until
from tests.launch.conftest import container_overrides, run_submit
from tests.launch.holding import hold_after, hold_overrides, is_holding, release
from tests.launch.jobs import logged_steps, rank0_log, restarts, signals_received, slurm_events, submit, wait_ended

STEPS = 30


def final_weights(workdir: Path, step: int) -> dict[str, torch.Tensor]:
    out = workdir / f"weights_{step}.pt"
    dcp_to_torch_save(workdir / "runs" / "grpo_tiny" / "checkpoints" / f"step_{step}" / "dcp", out)
    return torch.load(out, weights_only=False)["model"]


def preempt_then_requeue(job: str, workdir: Path, first: int, second: int, step_timeout_s: float = 240) -> None:
    """Two stops at known points, however fast the steps are: the job was submitted with
    hold_after(workdir, first), so it holds once step `first` is logged (holding.py).
    (a) A high-priority job needs all 4 nodes: Slurm preempts this one (USR2 now, SIGTERM after the
    grace time) and requeues it; once the signal has reached rank 0 the hold is released, and the
    step being sampled is dropped for the save. (b) The resumed run holds once step `second` is
    logged; `scontrol requeue`: the tasks get SIGTERM, save, and Slurm restarts the job."""
    wait_until(lambda: is_holding(workdir, first), step_timeout_s, f"the run to hold after step {first}")
    received = signals_received(workdir, job)
    high = subprocess.run(["sbatch", "--parsable", "-p", "high", "-N", "4", "--exclusive", f"--output={workdir}/high.out",
                           "--wrap", "sleep 3"], capture_output=True, text=True, timeout=30)
    assert high.returncode == 0, high.stderr
    wait_until(lambda: signals_received(workdir, job) > received, 180, "the preemption's signal to reach rank 0")
    hold_after(workdir, second)
    release(workdir, first)
    wait_until(lambda: restarts(job) >= 1, 180, "the preempted job to be requeued")
    wait_until(lambda: is_holding(workdir, second), step_timeout_s, f"the resumed run to hold after step {second}")
    received = signals_received(workdir, job)
    subprocess.run(["scontrol", "requeue", job], check=True, timeout=30)
    wait_until(lambda: signals_received(workdir, job) > received, 180, "the requeue's SIGTERM to reach rank 0")
    release(workdir, second)


def completed_after_two_resumes(job: str, workdir: Path, first: int, second: int, steps: int,
                                timeout_s: float = 900) -> str:
    """After preempt_then_requeue: the job completes, restarted twice, resumed once after each stop
    from the step it stopped after; returns rank 0's log."""
    assert wait_ended(job, timeout_s) == "COMPLETED"
    log = rank0_log(workdir, job)
    assert restarts(job) == 2, (restarts(job), slurm_events(job), log[-3000:])
    stops = [int(s) for s in re.findall(r"stopped after step (\d+)", log)]
    resumed = [int(s) for s in re.findall(r"resumed from .*step_(\d+) ", log)]
    # the sync loop stops after the held step itself; the async one after the steps its pipeline had
    # sampled ahead (its tests leave room for that between the two stops)
    assert resumed == stops and len(stops) == 2, (stops, resumed, slurm_events(job), log[-3000:])
    assert first <= stops[0] < second <= stops[1] < steps, (stops, log[-3000:])
    return log


@pytest.fixture(scope="module")
def uninterrupted_run(slurm_cluster, tmp_path_factory, tiny_model) -> Path:
    """The folder of grpo_tiny run to the end in the submitting environment's .venv, never stopped."""
    workdir = tmp_path_factory.mktemp("uninterrupted")
    result = run_submit(workdir, tiny_model, "--nodes", "3", "--wait", *hold_overrides(workdir),
                        f"grpo.max_num_steps={STEPS}", "checkpointing.save_period=1000", timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    return workdir


@pytest.fixture(scope="module")
def uninterrupted(uninterrupted_run):
    return final_weights(uninterrupted_run, STEPS)


def training_record(workdir: Path) -> list[tuple[float, ...]]:
    """Per step: loss, gradient norm, entropy and mean reward (the step's learning, not its timing)."""
    path = workdir / "runs" / "grpo_tiny" / "logs" / "metrics.jsonl"
    keys = ("train/loss", "train/grad_norm", "train/entropy", "reward/mean")
    return [tuple(json.loads(line)[key] for key in keys) for line in path.read_text().splitlines() if line.strip()]


def test_preempted_then_requeued_run_ends_bitwise_equal_to_an_uninterrupted_one(uninterrupted, tmp_path,
                                                                                tiny_model):
    rng = random.Random(int(os.environ.get("DOCKYARD_TEST_SEED", time.time())))
    first, second = rng.randint(3, 10), rng.randint(14, 22)
    print(f"interrupting after steps {first} (partition preemption) and {second} (scontrol requeue)")
    hold_after(tmp_path, first)
    job = submit(tmp_path, tiny_model, f"grpo.max_num_steps={STEPS}", "checkpointing.save_period=1000")

    preempt_then_requeue(job, tmp_path, first, second)
    log = completed_after_two_resumes(job, tmp_path, first, second, STEPS, timeout_s=600)
    assert re.findall(r"stopped after step (\d+)", log) == [str(first), str(second)]   # the sync loop: exactly there
    assert "USR2" in log and "SIGTERM" in log
    # every step logged once, in order, although steps after the first stop ran in three processes
    assert logged_steps(tmp_path) == list(range(1, STEPS + 1))
    weights = final_weights(tmp_path, STEPS)
    assert weights.keys() == uninterrupted.keys()
    for name in weights:
        assert torch.equal(weights[name], uninterrupted[name]), name


@pytest.mark.parametrize("runtime", ["slurm_oci", "charliecloud", "podman"])
def test_a_run_in_the_image_preempted_then_requeued_ends_bitwise_equal_to_an_uninterrupted_venv_run(
        runtime, uninterrupted, uninterrupted_run, dockyard_image, tmp_path, tiny_model):
    """grpo_tiny as a het job whose every step runs in the dockyard image: trainer tasks on two nodes, the
    rollout server on a third, each in the image's Python (which the host does not have) and knowing its
    node and rank (Slurm's OCI mode passes no per-task variable: recovered). USR2 reaches the trainer twice
    under slurm_oci (Slurm and runc both forward it) and it saves once; the checkpoints are on the mounted
    run folder, so the requeued containers resume from them, and the run ends with the weights of the
    .venv run, bit for bit. No podman container outlives its step, preempted or not."""
    import shutil

    from tests.conftest import REPO
    from tests.launch.conftest import IMAGE_PYTHON

    # the held reward's module (imports: tests.launch.held_reward) from the submit folder, which is mounted
    for name in ("__init__.py", "launch/__init__.py", "launch/held_reward.py", "launch/holding.py"):
        (tmp_path / "tests" / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / "tests" / name, tmp_path / "tests" / name)
    image = (dockyard_image / "complete").read_text().strip() if runtime == "podman" else str(dockyard_image)
    hold_after(tmp_path, 6)
    job = submit(tmp_path, tiny_model, f"grpo.max_num_steps={STEPS}", "checkpointing.save_period=1000",
                 *container_overrides(image, tiny_model, runtime))
    preempt_then_requeue(job, tmp_path, 6, 16)
    log = completed_after_two_resumes(job, tmp_path, 6, 16, STEPS, timeout_s=600)
    assert not Path(IMAGE_PYTHON).exists()   # so a step that ran it ran in the image
    inside = f"dockyard: container: trainer in {runtime} {image}; {IMAGE_PYTHON}"
    assert log.count(f"{inside}; node node1 task 0") == 3   # each incarnation, in the image
    assert f"{inside}; node node2 task 1" in (tmp_path / "slurm" / f"{job}_1_log.err").read_text()
    assert "trainer rank 0/2 on node1" in log and str(REPO) not in log   # the submitter's PYTHONPATH stayed out
    for incarnation in range(3):
        server = (tmp_path / "slurm" / f"{job}.{incarnation}_rollout0_node3.log").read_text()
        assert f"dockyard: container: rollout in {runtime} {image}; {IMAGE_PYTHON}; node node3 task 0" in server
    assert re.findall(r"stopped after step (\d+)", log) == ["6", "16"]
    assert logged_steps(tmp_path) == list(range(1, STEPS + 1))
    assert training_record(tmp_path) == training_record(uninterrupted_run)   # from the first step: as in the .venv
    weights = final_weights(tmp_path, STEPS)
    for name in uninterrupted:
        assert torch.equal(weights[name], uninterrupted[name]), name
    if runtime == "podman":   # the server's container, which srun's end of the step does not reach, is gone too
        left = subprocess.run(["podman", "ps", "-a", "--format", "{{.Names}}"], capture_output=True, text=True).stdout
        ours = (f"dockyard-{job}-", f"dockyard-{int(job) + 1}-")   # the trainer's component, the rollout's
        assert not [name for name in left.split() if name.startswith(ours)], left


MEGATRON = ["policy.backend=megatron", "policy.megatron_cfg={tensor_model_parallel_size: 1}",
            "checkpointing.export_hf=true"]


def exported_weights(workdir: Path, step: int) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(workdir / "runs" / "grpo_tiny" / "checkpoints" / f"step_{step}" / "hf" / "model.safetensors"))


def test_a_megatron_trainer_preempted_then_requeued_ends_bitwise_equal_to_an_uninterrupted_one(
        slurm_cluster, tmp_path_factory, tiny_model):
    """The megatron backend on the het job's trainer component (2 ranks over gloo, megatron's DDP and
    distributed optimizer): its dist checkpoints carry a preemption and a requeue exactly."""
    log = preempted_twice_ends_as_uninterrupted(tmp_path_factory, tiny_model, "megatron", MEGATRON, 16, 4, 10)
    assert "megatron trainer mesh: 2 rank(s)" in log


JAX = ["policy.backend=jax", "policy.jax_cfg.mesh.data=2", "checkpointing.export_hf=true"]


def test_a_jax_trainer_over_two_processes_preempted_then_requeued_ends_bitwise_equal_to_an_uninterrupted_one(
        slurm_cluster, tmp_path_factory, tiny_model):
    """The jax backend on the het job's trainer component: its 2 tasks join one JAX world from the
    allocation (coordinator on the first trainer node), each process one device of a data=2 mesh; its
    orbax steps carry a preemption and a requeue exactly."""
    log = preempted_twice_ends_as_uninterrupted(tmp_path_factory, tiny_model, "jax", JAX, 12, 4, 8)
    assert "jax trainer mesh: 2 data x 1 model = 2 cpu device(s) in 2 processes" in log


def preempted_twice_ends_as_uninterrupted(tmp_path_factory, model: Path, name: str, overrides: list[str], steps: int,
                                          first: int, second: int) -> str:
    """A run with `overrides` preempted after step `first` and requeued after `second` logs every step
    once and ends with the HF export of an uninterrupted run, bit for bit; returns rank 0's log."""
    straight = tmp_path_factory.mktemp(f"{name}-uninterrupted")
    result = run_submit(straight, model, "--nodes", "3", "--wait", *hold_overrides(straight),
                        f"grpo.max_num_steps={steps}", "checkpointing.save_period=1000", *overrides, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    workdir = tmp_path_factory.mktemp(f"{name}-preempted")
    hold_after(workdir, first)
    job = submit(workdir, model, f"grpo.max_num_steps={steps}", "checkpointing.save_period=1000", *overrides)
    preempt_then_requeue(job, workdir, first, second)
    log = completed_after_two_resumes(job, workdir, first, second, steps, timeout_s=600)
    assert logged_steps(workdir) == list(range(1, steps + 1))
    got, want = exported_weights(workdir, steps), exported_weights(straight, steps)
    assert got.keys() == want.keys()
    for weight in want:
        assert torch.equal(got[weight], want[weight]), weight
    return log
