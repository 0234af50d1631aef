"""dockyard-submit: validate, plan, render and submit ONE heterogeneous Slurm job through submitit.

Everything that can be wrong with a config is reported here, before anything is queued: schema and
cross-field rules, features this version cannot run, a model folder that does not exist.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Sequence

from dockyard.config import ConfigError, load_config, topology
from dockyard.config.loader import LoadedConfig, import_folders
from dockyard.config.schema import MasterConfig
from dockyard.config.job_plan import JobPlan, plan_job
from dockyard.config.slurm_time import minutes
from dockyard.launch.containers import (PODMAN_STEP_VARIABLE, ContainerError, SUBMIT_DIR_VARIABLE, podman_step, preflight_containers,
                                       step_container, write_step_roots)

EXIT_CONFIG, EXIT_FAILED, EXIT_NOT_SUBMITTED = 2, 1, 3
POLL_S = 3.0


def job_folder(cfg: MasterConfig) -> Path:
    return Path(cfg.cluster.slurm.folder or Path(cfg.logger.log_dir) / "slurm").absolute()


def _gpu_flags(cfg: MasterConfig, gpus: int) -> dict[str, Any]:
    if gpus <= 0:
        return {}
    return {"gpus_per_node": gpus} if cfg.cluster.slurm.gpu_flag == "gpus-per-node" else {"gres": f"gpu:{gpus}"}


def _shared_flags(cfg: MasterConfig) -> dict[str, Any]:
    """Options every component carries (Slurm takes them per component)."""
    slurm = cfg.cluster.slurm
    flags: dict[str, Any] = {"job_name": slurm.job_name or cfg.name or "dockyard",
                             "time": int(-(-minutes(slurm.time) // 1))}
    for key in ("partition", "account", "qos", "constraint", "mem", "cpus_per_task"):
        if getattr(slurm, key) is not None:
            flags[key] = getattr(slurm, key)
    if slurm.exclusive:
        flags["exclusive"] = True
    return flags


def build_executor(cfg: MasterConfig, plan: JobPlan, folder: Path, require_slurm: bool = True):
    from dockyard.launch.executor import HetSlurmExecutor

    slurm = cfg.cluster.slurm
    shared = _shared_flags(cfg)
    extra = []
    for component in plan.components[1:]:
        flags = {k.replace("_", "-"): v for k, v in shared.items()}
        flags.update({"nodes": component.nodes, "ntasks-per-node": component.tasks_per_node})
        flags.update({k.replace("_", "-"): v for k, v in _gpu_flags(cfg, component.gpus_per_node).items()})
        flags.update(slurm.additional)
        extra.append(flags)
    executor = HetSlurmExecutor(folder, extra_components=extra, require_slurm=require_slurm)
    trainer = plan.trainer
    srun_args = ["--kill-on-bad-exit=1"] + (["--het-group=0"] if extra else [])
    container = step_container(cfg, "trainer", folder)
    if container is not None:
        srun_args += container.srun_flags(folder)
        executor.python = container.python_words()   # the image's Python, started in the container
    additional: dict[str, Any] = dict(slurm.additional)
    if slurm.requeue:
        additional["requeue"] = True
    executor.update_parameters(nodes=trainer.nodes, ntasks_per_node=trainer.tasks_per_node,
                               signal_delay_s=slurm.signal_delay_s, setup=list(slurm.setup), srun_args=srun_args,
                               additional_parameters=additional, **shared, **_gpu_flags(cfg, trainer.gpus_per_node))
    return executor


def plan_components(plan: JobPlan) -> list[str]:
    """The components whose steps the job runs: the trainer, and the server groups it has."""
    return ["trainer"] + [role for role in ("rollout", "teacher") if plan.server_group(role) is not None]


def write_bundles(cfg: MasterConfig, plan: JobPlan, folder: Path) -> list[Path]:
    """Each component's bundle (slurm_oci) or linked root (charliecloud) in the job folder, before sbatch
    (servers.py finds them there)."""
    return write_step_roots([step_container(cfg, component, folder) for component in plan_components(plan)], folder)


def _flag_overrides(ns: argparse.Namespace) -> list[str]:
    pairs = [("cluster.num_nodes", ns.nodes), ("cluster.slurm.partition", ns.partition),
             ("cluster.slurm.account", ns.account), ("cluster.slurm.qos", ns.qos), ("cluster.slurm.time", ns.time)]
    return [f"{key}={shlex.quote(str(value)) if key.endswith('time') and ':' in str(value) else value}"
            for key, value in pairs if value is not None]


def _say(message: str) -> None:
    print(f"dockyard-submit: {message}", file=sys.stderr, flush=True)


def _headline(error: BaseException) -> str:
    """dockyard's own JobFailed text where a task raised it, else the last line of the traceback."""
    text = str(error).split("\n\n-----")[0].strip()
    marker = "JobFailed: "
    if marker in text:
        return text[text.rindex(marker) + len(marker):]
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else type(error).__name__


def failure_report(job) -> str:
    """Why the job failed: Slurm's account of which task exited first, then each trainer task's reason."""
    lines = []
    batch_err = Path(str(job.paths.stderr).replace("%t", "0"))
    if batch_err.is_file():
        lines += [line for line in batch_err.read_text(errors="replace").splitlines()
                  if line.startswith("srun: error:")][:4]
    for task in range(job.num_tasks):
        try:
            error = job.task(task).exception()
        except Exception as err:  # no result pickle: submitit says the task produced no output
            error = err
        if error is not None:
            lines.append(f"trainer task {task}: {_headline(error)}")
    return "\n".join(lines)


END_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL",
              "DEADLINE", "PREEMPTED"}
RESULTS_WITHOUT_STATE_S = 60


def _state(job) -> str:
    # "CANCELLED by 0" -> CANCELLED
    return job.watcher.get_state(job.job_id, mode="force").split()[0]


def wait_for(job, timeout_s: float | None) -> int:
    """Until Slurm reports an end state (a requeued job is not ended). Where sacct never answers, every
    trainer task's result file standing for a minute counts as the end."""
    started, last, results_since = time.monotonic(), None, None
    while True:
        state = _state(job)
        if state != last:
            _say(f"job {job.job_id}: {state}")
            last = state
        if state in END_STATES:
            break
        if all(job.task(t).paths.result_pickle.exists() for t in range(job.num_tasks)):
            results_since = results_since or time.monotonic()
            if state == "UNKNOWN" and time.monotonic() - results_since > RESULTS_WITHOUT_STATE_S:
                break
        if timeout_s is not None and time.monotonic() - started > timeout_s:
            _say(f"stopped waiting after {timeout_s:.0f} s (--wait-timeout); job {job.job_id} is still {state}")
            return 4
        time.sleep(POLL_S)
    failure = failure_report(job)
    if state in ("COMPLETED", "UNKNOWN") and "trainer task" not in failure:
        _say(f"job {job.job_id}: finished")
        return 0
    _say(f"job {job.job_id} ended: {state}" + (f"\n{failure}" if failure else ""))
    _say(f"logs: {job.paths.folder}")
    return EXIT_FAILED


def submit(loaded: LoadedConfig, dry_run: bool, wait: bool, wait_timeout_s: float | None, workers: int = 0,
           workers_only: bool = False, worker_partition: str | None = None) -> int:
    from dockyard.launch.job import TrainerJob

    from dockyard.preflight import preflight

    cfg = loaded.config
    plan = plan_job(cfg)
    report = preflight(cfg, "submit", plan)
    if (workers or workers_only) and cfg.data_plane is None:
        from dockyard.config.errors import Problem

        report.problems.append(Problem("data_plane", "--rollout-workers / --workers-only: rollout-worker jobs "
                                       "join a data-plane run; this config has no data_plane section"))
    folder = job_folder(cfg)
    # sbatch passes this process's environment on: the job finds the config's imports: modules, and the
    # containers' mounts and working folder are rendered from these
    os.environ["DOCKYARD_IMPORT_PATH"] = import_folders(Path(loaded.source))
    os.environ[SUBMIT_DIR_VARIABLE] = str(Path.cwd().absolute())
    os.environ[PODMAN_STEP_VARIABLE] = podman_step()
    problems, notes = preflight_containers(cfg, plan_components(plan), folder)
    report.problems += problems
    report.skipped += notes
    report.print("dockyard-submit", loaded.source)
    if report.problems:
        _say("nothing was submitted")
        return EXIT_CONFIG
    if workers_only:
        return submit_workers(loaded, folder, workers, worker_partition, dry_run)
    print(f"plan for {loaded.source} ({plan.total_nodes} nodes):\n{plan.table()}\n"
          f"{topology.trainer_mesh_line(cfg)}\n")
    if dry_run:
        executor = build_executor(cfg, plan, folder, require_slurm=False)
        print("sbatch script:\n")
        print(executor._make_submission_file_text(executor._submitit_command_str, "dry-run"))
        if workers:
            submit_workers(loaded, folder, workers, worker_partition, dry_run=True)
        _say("dry run: nothing was submitted")
        return 0
    executor = build_executor(cfg, plan, folder)
    folder.mkdir(parents=True, exist_ok=True)
    config_path = folder / f"config_{time.strftime('%Y%m%d-%H%M%S')}_{uuid.uuid4().hex[:6]}.yaml"
    config_path.write_text(loaded.to_yaml())
    Path(cfg.logger.log_dir).mkdir(parents=True, exist_ok=True)
    (Path(cfg.logger.log_dir) / "config.yaml").write_text(loaded.to_yaml())
    try:
        bundles = write_bundles(cfg, plan, folder)
    except ContainerError as err:   # e.g. the job folder on another file system than the image
        _say(f"{err.report()}; nothing was submitted")
        return EXIT_CONFIG
    if bundles:
        print(f"container roots (cluster.container.runtime: {cfg.cluster.container.runtime}): "
              f"{', '.join(map(str, bundles))}", flush=True)
    try:
        job = executor.submit(TrainerJob(str(config_path), plan.to_dict(), str(folder)))
    except Exception as err:  # sbatch refused: its message says why (partition, account, limits)
        _say(f"sbatch refused the job: {err}")
        return EXIT_NOT_SUBMITTED
    stdout = str(job.paths.stdout).replace("%t", "0")
    print(f"submitted job {job.job_id}\n"
          f"  driver log (trainer rank 0): {stdout}\n"
          f"  errors:                      {str(job.paths.stderr).replace('%t', '0')}\n"
          f"  server logs:                 {folder}/{job.job_id}.<restart>_rollout<i>_<node>.log\n"
          f"  metrics:                     {cfg.logger.log_dir} (tensorboard --logdir {cfg.logger.log_dir})\n"
          f"  follow:                      tail -f {stdout}   |   squeue -j {job.job_id}   |   scancel {job.job_id}",
          flush=True)
    if workers:
        code = submit_workers(loaded, folder, workers, worker_partition, dry_run=False, config_path=config_path)
        if code:
            return code
    if wait:
        return wait_for(job, wait_timeout_s)
    return 0


def submit_workers(loaded: LoadedConfig, folder: Path, count: int, partition: str | None, dry_run: bool,
                   config_path: Path | None = None) -> int:
    """`count` rollout-worker jobs of a data-plane run, each one node (launch/worker_job.py)."""
    from dockyard.launch.worker_job import RolloutWorkerJob, build_worker_executor

    cfg = loaded.config
    rollout = cfg.cluster.rollout
    flags = (_shared_flags(cfg), _gpu_flags(cfg, cfg.cluster.gpus_per_node if rollout.gpus_per_node is None
                                             else rollout.gpus_per_node))
    if dry_run:
        executor = build_worker_executor(cfg, folder, partition, *flags, require_slurm=False)
        print(f"sbatch script of each of the {count} rollout-worker job(s):\n")
        print(executor._make_submission_file_text(executor._submitit_command_str, "dry-run"))
        return 0
    if count < 1:
        _say("--workers-only needs --rollout-workers N (N >= 1)")
        return EXIT_CONFIG
    if config_path is None:
        folder.mkdir(parents=True, exist_ok=True)
        config_path = folder / f"config_{time.strftime('%Y%m%d-%H%M%S')}_{uuid.uuid4().hex[:6]}.yaml"
        config_path.write_text(loaded.to_yaml())
    executor = build_worker_executor(cfg, folder, partition, *flags)
    ids = []
    try:
        os.environ["DOCKYARD_IMPORT_PATH"] = import_folders(Path(loaded.source))
        for _ in range(count):
            ids.append(executor.submit(RolloutWorkerJob(str(config_path))).job_id)
    except Exception as err:  # sbatch refused: its message says why
        _say(f"sbatch refused a rollout-worker job: {err}" + (f" (submitted before it: {', '.join(ids)})" if ids else ""))
        return EXIT_NOT_SUBMITTED
    print(f"submitted {len(ids)} rollout-worker job(s): {' '.join(ids)}\n"
          f"  logs:   {folder / 'workers'}/<job>_0_log.err and {cfg.logger.log_dir}/workers/<worker>/\n"
          f"  remove: scancel <job> (its prompts go back to the plane)", flush=True)
    return 0


def submit_main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="dockyard-submit",
                                     description="validate a config and submit it as one heterogeneous Slurm job")
    parser.add_argument("--config", required=True, help="config file (a path, or a name from the config family)")
    parser.add_argument("--config-dir", action="append", default=[], metavar="DIR",
                        help="extra folder searched for configs and groups (repeatable)")
    parser.add_argument("--nodes", type=int, help="nodes for the whole run (cluster.num_nodes)")
    parser.add_argument("--partition", help="cluster.slurm.partition")
    parser.add_argument("--account", help="cluster.slurm.account")
    parser.add_argument("--qos", help="cluster.slurm.qos")
    parser.add_argument("--time", help="cluster.slurm.time: minutes or [D-]HH:MM:SS")
    parser.add_argument("--dry-run", action="store_true", help="print the plan and the sbatch script; submit nothing")
    parser.add_argument("--wait", action="store_true", help="block until the job ends; exit with its status")
    parser.add_argument("--wait-timeout", type=float, metavar="S", help="with --wait: stop waiting after S seconds")
    parser.add_argument("--rollout-workers", type=int, default=0, metavar="N",
                        help="data_plane: also submit N rollout-worker jobs of one node each")
    parser.add_argument("--workers-only", action="store_true",
                        help="with --rollout-workers: add workers to a data-plane run already going; no trainer job")
    parser.add_argument("--worker-partition", help="partition of the rollout-worker jobs (default: "
                        "cluster.slurm.partition), e.g. a preemptible one")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides (a.b=v, +a.new=v, ~a.b)")
    ns = parser.parse_intermixed_args(argv)   # overrides may come before or after the flags
    try:
        loaded = load_config(ns.config, list(ns.overrides) + _flag_overrides(ns), ns.config_dir)
    except ConfigError as err:
        print(err.render(), file=sys.stderr)
        _say("nothing was submitted")
        return EXIT_CONFIG
    loaded.print_advice()
    return submit(loaded, ns.dry_run, ns.wait, ns.wait_timeout, ns.rollout_workers, ns.workers_only,
                  ns.worker_partition)
