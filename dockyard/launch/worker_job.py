"""Rollout-worker jobs of a data-plane run: `dockyard-submit --rollout-workers N` submits N Slurm jobs
of one node each (cluster.rollout sizes them), apart from the trainer's job, through submitit. Each
runs `dockyard rollout-worker` on the run's resolved config (plane/worker.py): it may start late,
be preempted, time out or never start; the trainer does not wait for any of them."""

from __future__ import annotations

from pathlib import Path

from dockyard.config.loader import read_resolved
from dockyard.config.schema import MasterConfig
from dockyard.errors import ComponentError


class WorkerFailed(ComponentError, RuntimeError):
    pass


class RolloutWorkerJob:
    """Picklable: the resolved config file (on shared storage)."""

    def __init__(self, config_path: str):
        self.config_path = config_path

    def __call__(self) -> dict:
        import os

        from dockyard.plane.worker import run_worker_config, worker_id

        name = worker_id()
        code = run_worker_config(read_resolved(Path(self.config_path)), self.config_path, name)
        if code != 0:
            raise WorkerFailed(f"rollout worker {name} (job {os.environ.get('SLURM_JOB_ID')}) ended with status "
                               f"{code} (see its log)")
        return {"worker": name, "status": "left"}


def build_worker_executor(cfg: MasterConfig, folder: Path, partition: str | None, shared: dict,
                          gpu_flags: dict, require_slurm: bool = True):
    """One node, one task: the worker starts its servers itself, as `dockyard run` does. `shared` and
    `gpu_flags` are the options dockyard-submit gives every job of the run (launch/submit.py)."""
    from dockyard.launch.executor import HetSlurmExecutor

    shared = dict(shared, job_name=f"{shared['job_name']}-rollout")
    if partition is not None:
        shared["partition"] = partition
    executor = HetSlurmExecutor(folder / "workers", require_slurm=require_slurm)
    executor.update_parameters(nodes=1, ntasks_per_node=1, setup=list(cfg.cluster.slurm.setup),
                               additional_parameters=dict(cfg.cluster.slurm.additional), **shared, **gpu_flags)
    return executor
