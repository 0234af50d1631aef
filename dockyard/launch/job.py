"""The job's entry point inside the allocation: what every trainer task of het group 0 runs.

dockyard-submit pickles a `TrainerJob` through submitit; submitit starts it on each trainer task
(`srun --het-group=0`) and keeps its USR2 -> checkpoint() -> requeue path. Each task turns the
allocation into a torch.distributed rank; rank 0 (the driver) starts the generation servers as
their own steps, waits for them, then every rank runs the GRPO loop. A server or rank that dies
ends the job with a message naming it.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import submitit
import torch
import torch.distributed as dist

from dockyard.config.loader import read_resolved
from dockyard.distributed import backend_for
from dockyard.errors import ComponentError
from dockyard.launch.allocation import Allocation
from dockyard.config.job_plan import JobPlan
from dockyard.launch.preemption import allocation_end_time, requeue
from dockyard.loop.stopping import DESCRIPTION, USR2, RunStopped, StopRequests
from dockyard.launch.rendezvous import trainer_store
from dockyard.launch.servers import (ServerFailed, ServerWatch, dead_server, replica_clients, start_servers,
                                    stop_servers, wait_ready)


class JobFailed(ComponentError, RuntimeError):
    """Raised in a trainer task so submitit records the failure (and the message) as the job's result."""


class TrainerJob(submitit.helpers.Checkpointable):
    """Picklable: the resolved config file, the plan and the job folder (all on shared storage)."""

    def __init__(self, config_path: str, plan: dict, folder: str):
        self.config_path, self.plan, self.folder = config_path, plan, folder

    def __call__(self) -> dict:
        return run_trainer_task(Path(self.config_path), JobPlan.from_dict(self.plan), Path(self.folder))


def run_trainer_task_from_config(config_path: Path, folder: Path) -> dict:
    """The hand-written sbatch templates' path: the plan is derived from the resolved config."""
    from dockyard.config.job_plan import plan_job

    folder.mkdir(parents=True, exist_ok=True)
    cfg = read_resolved(config_path)
    return run_trainer_task(config_path, plan_job(cfg), folder)


def _threads(plan: JobPlan) -> int:
    cpus = int(os.environ.get("SLURM_CPUS_PER_TASK", 0))
    return cpus or max(1, (os.cpu_count() or 1) // plan.trainer.tasks_per_node)


SIGNAL_GRACE_S = 3.0   # Slurm signals the steps of a job one by one: a server may die of it first


def stopped_while_starting(stopper: StopRequests) -> bool:
    """Whether a server that died while starting was ended by the job's own stop (the trainer's signal
    comes within a moment of the server's), rather than by a failure of its own."""
    deadline = time.monotonic() + SIGNAL_GRACE_S
    while not stopper.requested and time.monotonic() < deadline:
        time.sleep(0.1)
    return stopper.requested


def _start_broker(cfg, alloc: Allocation, folder: Path):
    """data_plane.start: the broker on rank 0's node for this incarnation (its append-only file in the
    run folder carries what it held across a requeue; workers re-read its address), watched and
    started again should it die."""
    import threading

    from dockyard.plane.broker import ManagedBroker

    say = lambda message: print(f"dockyard: {message}", file=sys.stderr, flush=True)   # noqa: E731
    broker = ManagedBroker(cfg, alloc.node, folder / f"{alloc.job_id}.{alloc.restart_count}_broker_{alloc.node}.log",
                           say)
    say(f"data plane broker (redis-server) at {broker.address}")

    def watch() -> None:
        while broker.watch():
            time.sleep(1.0)

    threading.Thread(target=watch, daemon=True, name="broker-watch").start()
    return broker


def run_trainer_task(config_path: Path, plan: JobPlan, folder: Path) -> dict:
    from dockyard.loop import entry

    alloc = Allocation.from_env()
    cfg = read_resolved(config_path)
    timeout_s = float(os.environ.get("DOCKYARD_COLLECTIVE_TIMEOUT_S", 1800))
    device = torch.device("cuda", alloc.local_rank) if cfg.cluster.gpus_per_node > 0 else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    os.environ.update(RANK=str(alloc.rank), WORLD_SIZE=str(alloc.world_size), LOCAL_RANK=str(alloc.local_rank),
                      DOCKYARD_CONFIG=str(config_path), DOCKYARD_THREADS=str(_threads(plan)),
                      DOCKYARD_WEIGHT_SYNC_ADDR=alloc.node, DOCKYARD_WEIGHT_SYNC_PORT="0")
    os.environ.update(cfg.policy.env_vars)
    if alloc.het_size > 1:
        # tools that read the plain variable (submitit's helpers, user code) must see the trainer's
        # nodes, not another component's or the union
        os.environ["SLURM_JOB_NODELIST"] = os.environ.get("SLURM_JOB_NODELIST_HET_GROUP_0",
                                                          os.environ.get("SLURM_JOB_NODELIST", ""))
    print(f"dockyard: trainer rank {alloc.rank}/{alloc.world_size} on {alloc.node} (pid {os.getpid()}, job {alloc.job_id}, "
          f"restart {alloc.restart_count})", file=sys.stderr, flush=True)

    end = allocation_end_time(alloc.job_id)
    stopper = StopRequests(device, deadline=end, margin_s=cfg.cluster.slurm.deadline_margin_s).install()
    if alloc.rank == 0 and end is not None:
        print(f"dockyard: the allocation ends at {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(end))} "
              f"({(end - time.time()) / 60:.1f} min from now); the run saves and requeues before that",
              file=sys.stderr, flush=True)
    steps, watch, broker = [], None, None
    try:
        if alloc.rank == 0 and cfg.data_plane is not None and cfg.data_plane.start:
            broker = _start_broker(cfg, alloc, folder)
        if alloc.rank == 0:
            steps = start_servers(cfg, plan, alloc, folder, "rollout")
            if cfg.on_policy_distillation is not None:
                from dockyard.loop.teachers import teacher_model_folder

                # a teacher from a dockyard checkpoint is served from an HF folder written here first
                folders = {t.name: teacher_model_folder(t, folder / "teachers")
                           for t in cfg.on_policy_distillation.teachers}
                steps += start_servers(cfg, plan, alloc, folder, "teacher", teacher_folders=folders)
            for step in steps:
                print(f"dockyard: started {step.name} on {step.node} (log: {step.log})", file=sys.stderr, flush=True)
            wait_ready(steps, cfg.cluster.slurm.server_health_timeout_s)
            for step in steps:
                print(f"dockyard: {step.name} ready at {step.url}", file=sys.stderr, flush=True)
            os.environ["DOCKYARD_REPLICAS"] = json.dumps([
                {"name": f"{step.name} on node {step.node}", "url": step.url, "log": str(step.log)}
                for step in steps if step.role == "rollout"])
            teachers: dict[str, list[dict]] = {}
            for step in steps:
                if step.teacher is not None:
                    teachers.setdefault(step.teacher, []).append(
                        {"name": f"{step.name} on node {step.node}", "url": step.url, "log": str(step.log)})
            os.environ["DOCKYARD_TEACHERS"] = json.dumps(teachers)
            watch = ServerWatch(steps, stopper=stopper, clients=replica_clients(cfg, steps)).start()
        store = trainer_store(folder / f"rendezvous_{alloc.incarnation}.json", alloc.rank, alloc.world_size,
                              alloc.node, timeout_s=cfg.cluster.slurm.server_health_timeout_s + 120)
        from datetime import timedelta
        dist.init_process_group(backend_for(device), store=store, rank=alloc.rank, world_size=alloc.world_size,
                                timeout=timedelta(seconds=timeout_s))
        code = entry.main(stopper)
        cause = dead_server(steps, grace_s=10.0) if code != 0 and steps else None
        if cause:
            raise JobFailed(cause)
        if code != 0:
            raise JobFailed(f"trainer rank {alloc.rank} on {alloc.node} ended with status {code} (see its log)")
        return {"rank": alloc.rank, "node": alloc.node, "status": "completed"}
    except RunStopped as stop:
        if alloc.rank == 0:
            print(f"dockyard: {stop}", file=sys.stderr, flush=True)
            if stop.wants_requeue:
                requeue(alloc.job_id)
        # no result for submitit to record: this incarnation is over, the job itself is not
        raise SystemExit(0) from None
    except ServerFailed as err:
        if not stopped_while_starting(stopper):
            raise JobFailed(str(err)) from None
        # the servers died of the stop signal itself (a requeue or a preemption while they started):
        # nothing was trained yet, so nothing is saved; Slurm restarts a requeued job, USR2 asks us to
        if alloc.rank == 0:
            requeued = stopper.local == USR2
            print(f"dockyard: {DESCRIPTION[stopper.local]} while the servers started; nothing to save before the "
                  f"first step; {'requeued: ' if requeued else ''}the run resumes at the next start",
                  file=sys.stderr, flush=True)
            if requeued:
                requeue(alloc.job_id)
        raise SystemExit(0) from None
    except KeyboardInterrupt:
        if stopper.requested and not (watch is not None and watch.failure):
            raise SystemExit(0) from None
        if watch is not None and watch.failure:
            raise JobFailed(watch.failure) from None
        raise
    except Exception as err:
        cause = dead_server(steps, grace_s=10.0) if steps else None
        if cause:
            raise JobFailed(f"{cause}\n(the trainer then failed with: {type(err).__name__}: {err})") from None
        raise
    finally:
        # The work is done or saved. A late USR2 / SIGTERM must not kill the process while it writes its
        # result: Python's exit restores the default action (terminate) for signals it handled.
        signal.signal(signal.SIGUSR2, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if watch is not None:
            watch.stop()
        stop_servers(steps)
        if broker is not None:
            broker.stop()
        if dist.is_initialized():
            dist.destroy_process_group()
