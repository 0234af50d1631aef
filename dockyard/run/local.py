"""`dockyard run`: the GRPO loop on this machine, no Slurm.

Starts the generation servers (topology.rollout_replicas of them; cluster.rollout.tasks_per_node=2
starts two, each bound to its own cores) and, for on-policy distillation, a server per teacher
(loop/teachers.py) as processes of their own, and the trainer ranks as torch.distributed processes at
the same time: the ranks load the model while the servers load theirs, and rank 0 waits for /health
before its first refit. The driver watches all of them: if any dies, a server does not answer /health
within ENGINE_HEALTH_TIMEOUT_S of its start, or stops answering it later, the others are stopped and
the run ends with a message naming the process and its log file. No hang.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from dockyard import registry
from dockyard.config import topology
from dockyard.config.loader import LoadedConfig, import_folders
from dockyard.distributed import free_port
from dockyard.errors import DockyardError
from dockyard.generation.health import HealthProbe
from dockyard.config.topology import teacher_servers
from dockyard.loop.teachers import teacher_model_folder
from dockyard.launch.startup_guard import signals_blocked
from dockyard.plane.broker import ManagedBroker
from dockyard.preflight import preflight
from dockyard.processes import Child, log_tail, start_server, stop_processes

ENGINE_HEALTH_TIMEOUT_S = float(os.environ.get("DOCKYARD_ENGINE_HEALTH_TIMEOUT_S", 600))
SHUTDOWN_GRACE_S = 30


class Terminated(Exception):
    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum, self.name = signum, signal.Signals(signum).name


class GracefulStop:
    """Ctrl-C, SIGTERM or SIGHUP: the first asks the trainer ranks to save at their next safe point and
    exit (a SIGTERM to each, which they handle like a preemption); a second, or one before any rank
    can have trained (no rank yet, or a server not yet up: nothing to save), stops everything at once."""

    def __init__(self):
        self.ranks: list[Child] = []
        self.servers_ready = lambda: False
        self.signum: int | None = None

    def install(self) -> "GracefulStop":
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, self._handle)
        return self

    def _handle(self, signum, frame) -> None:
        if self.signum is not None or not self.ranks or not self.servers_ready():
            raise Terminated(signum)
        self.signum = signum
        print(f"dockyard run: {signal.Signals(signum).name} received; the trainer saves at its next safe point "
              "and stops (press Ctrl-C again to stop at once, losing the steps after the last checkpoint)",
              file=sys.stderr, flush=True)
        for child in self.ranks:
            if child.process.poll() is None:
                child.process.send_signal(signal.SIGTERM)


def _stop(children: list[Child]) -> None:
    stop_processes((child.process for child in children), SHUTDOWN_GRACE_S)


def _last_checkpoint(cfg) -> str:
    pointer = Path(cfg.checkpointing.checkpoint_dir) / "latest_checkpointed_iteration.txt"
    if not cfg.checkpointing.enabled:
        return "checkpointing is disabled: nothing of this run is kept"
    if not pointer.is_file():
        return "no checkpoint was saved: the next run starts from step 0"
    return f"the last checkpoint is step {pointer.read_text().strip()} in {pointer.parent}"


def run_local(loaded: LoadedConfig) -> int:
    cfg = loaded.config
    report = preflight(cfg, "local")
    report.print("dockyard run", loaded.source)
    if report.problems:
        return 2

    log_dir = Path(cfg.logger.log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    config_file = log_dir / "config.yaml"
    config_file.write_text(loaded.to_yaml())
    world_size = topology.trainer_world_size(cfg)
    cores = os.cpu_count() or 1

    # The children run in sessions of their own (a Ctrl-C reaches only this driver); a SIGTERM or
    # SIGHUP (kill, timeout, a closed terminal) must stop them too instead of leaving them running.
    stopping = GracefulStop().install()
    master_port = free_port()
    server = registry.build("generation_backend", cfg.policy.generation.backend, config=cfg)
    backend = cfg.policy.generation.backend
    # a data-plane run generates in rollout-worker jobs (`dockyard rollout-worker`), not beside the trainer
    count = 0 if cfg.data_plane is not None else topology.rollout_replicas(cfg)
    children: list[Child] = []
    replicas: list[dict] = []
    clients = []
    teachers: dict[str, list[dict]] = {}
    teacher_list = teacher_servers(cfg)
    launches = [(server, f"rollout replica {index} ({backend})" if count > 1 else f"generation server ({backend})",
                 log_dir / (f"engine_{index}.log" if count > 1 else "engine.log"), cfg.cluster.rollout.env,
                 replica_devices(cfg, index), None) for index in range(count)]
    if teacher_list:
        try:
            folders = {t.name: teacher_model_folder(t, log_dir / "teachers") for t in cfg.on_policy_distillation.teachers}
        except Exception as err:   # a checkpoint that cannot be exported names itself
            print(f"dockyard run: a teacher's checkpoint_path cannot be served: {err}", file=sys.stderr)
            return 2
        tp = cfg.on_policy_distillation.parallelism.tensor_parallel_size if cfg.cluster.gpus_per_node else None
        for name, index in teacher_list:
            launcher = registry.build("generation_backend", backend, config=cfg, model_path=folders[name],
                                      tensor_parallel_size=tp)
            launches.append((launcher, f"teacher {name}" + (f" replica {index}" if index else "") + f" ({backend})",
                             log_dir / f"teacher_{name}_{index}.log", cfg.cluster.teacher.env, {}, name))
    for slot, (launcher, name, log, group_env, devices, teacher) in enumerate(launches):
        child, url = start_server(launcher, name, log, {**group_env, **devices}, slot, len(launches), cores)
        children.append(child)
        entry = {"name": name, "url": url, "log": str(log)}
        if teacher is None:
            replicas.append(entry)
        else:
            teachers.setdefault(teacher, []).append(entry)
        clients.append(launcher.client(url, name, log))
    count = len(launches)   # every server is watched the same way: a dead or hung one ends the run, named
    health = HealthProbe(clients, start_timeout_s=ENGINE_HEALTH_TIMEOUT_S)
    stopping.servers_ready = lambda: all(health.ready)
    try:
        broker = _start_broker(cfg, log_dir) if cfg.data_plane is not None and cfg.data_plane.start else None
    except DockyardError as err:
        print(f"dockyard run: {err.report()}", file=sys.stderr)
        _stop(children)
        return err.exit_status
    try:
        if cfg.data_plane is not None:
            print(f"dockyard run: data plane: rollouts come from rollout workers; start them with `dockyard "
                  f"rollout-worker --config {config_file}` (here or as jobs: slurm/rollout_worker.sbatch)",
                  file=sys.stderr, flush=True)
        print(f"dockyard run: starting {len(replicas)} {backend} generation server{'s' if len(replicas) > 1 else ''}"
              + (f" and {len(teacher_list)} teacher server{'s' if len(teacher_list) > 1 else ''}" if teacher_list else "")
              + f" (logs: {', '.join(str(launch[2]) for launch in launches)})", file=sys.stderr, flush=True)
        for rank in range(world_size):
            env = dict(os.environ, **cfg.policy.env_vars, RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank),
                       MASTER_ADDR="127.0.0.1", MASTER_PORT=str(master_port), DOCKYARD_CONFIG=str(config_file),
                       DOCKYARD_REPLICAS=json.dumps(replicas), DOCKYARD_TEACHERS=json.dumps(teachers),
                       DOCKYARD_IMPORT_PATH=import_folders(Path(loaded.source)),
                       DOCKYARD_THREADS=str(max(1, cores // world_size)),
                       # rank 0's own wait for /health; the driver gives up first and names the server
                       DOCKYARD_SERVER_START_TIMEOUT_S=str(ENGINE_HEALTH_TIMEOUT_S + 60))
            log = None if rank == 0 else log_dir / f"trainer_rank{rank}.log"
            out = None if log is None else open(log, "w")
            with signals_blocked():   # pending, not fatal, until the rank handles them
                process = subprocess.Popen([sys.executable, "-m", "dockyard.loop"], env=env, stdout=out,
                                           stderr=subprocess.STDOUT if out else None, start_new_session=True)
            children.append(Child(f"trainer rank {rank}", process, log))
            stopping.ranks.append(children[-1])
        (log_dir / "processes.json").write_text(json.dumps(
            {child.name: {"pid": child.process.pid, "log": str(child.log) if child.log else None}
             for child in children}, indent=2))
        print(f"dockyard run: {world_size} trainer rank(s) started; logs in {log_dir}", file=sys.stderr, flush=True)
        code = _supervise(children[:count], children[count:], health, broker)
        if stopping.signum is not None and code == 0:
            print(f"dockyard run: stopped; {_last_checkpoint(cfg)}. Run the same command again to resume.",
                  file=sys.stderr)
            return 128 + stopping.signum
        return code
    except Terminated as stop:
        print(f"dockyard run: {stop.name} received; stopping every process at once; {_last_checkpoint(cfg)}",
              file=sys.stderr)
        return 128 + stop.signum
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, signal.SIG_IGN)  # a repeated kill must not cut the stopping short
        if not all(health.ready):   # rank 0 waits for every server before step 1: nothing to save
            stop_processes((child.process for child in children[count:]), 0)
        _stop(children + ([broker.child] if broker is not None else []))
        for client in clients:
            client.close()


def replica_devices(cfg, index: int) -> dict[str, str]:
    """A GPU replica's devices on this machine: rollout_gpus_per_replica of them, in order."""
    if cfg.cluster.gpus_per_node == 0:
        return {}
    per = cfg.cluster.rollout_gpus_per_replica
    first = (index * per) % max(1, cfg.cluster.gpus_per_node)
    return {"CUDA_VISIBLE_DEVICES": ",".join(str(first + i) for i in range(per))}


def _start_broker(cfg, log_dir: Path) -> ManagedBroker:
    broker = ManagedBroker(cfg, "127.0.0.1", log_dir / "broker.log", say=lambda m: print(f"dockyard run: {m}",
                                                                                      file=sys.stderr, flush=True))
    print(f"dockyard run: data plane broker (redis-server) at {broker.address}, append-only file in "
          f"{Path(cfg.checkpointing.checkpoint_dir) / 'data_plane' / 'broker'}", file=sys.stderr, flush=True)
    return broker


def _supervise(servers: list[Child], ranks: list[Child], health: HealthProbe,
               broker: ManagedBroker | None = None) -> int:
    """Wait for rank 0 to finish; any process that dies first, or a server that hangs, ends the run, named."""
    while True:
        if broker is not None and not broker.watch():
            return 3
        for child in ranks:
            code = child.process.poll()
            if code is not None and code != 0:
                print(f"dockyard run: {child.describe()} exited with status {code}; stopping the others\n"
                      f"{log_tail(child.log)}", file=sys.stderr)
                return code if code > 0 else 1
        if ranks[0].process.poll() == 0:
            deadline = time.monotonic() + SHUTDOWN_GRACE_S
            for child in ranks[1:]:
                try:
                    code = child.process.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    print(f"dockyard run: {child.describe()} did not finish {SHUTDOWN_GRACE_S} s after rank 0",
                          file=sys.stderr)
                    return 1
                if code != 0:
                    print(f"dockyard run: {child.describe()} exited with status {code}", file=sys.stderr)
                    return code
            return 0
        for index, server in enumerate(servers):
            if server.process.poll() is not None:
                when = "during the run" if health.ready[index] else "before it answered /health"
                print(f"dockyard run: {server.describe()} exited with status {server.process.returncode} "
                      f"{when}; stopping the trainer\n{log_tail(server.log)}", file=sys.stderr)
                return 3
        hung = health.hung()
        if hung is not None:
            print(f"dockyard run: {health.describe(hung)}; stopping the run (log: {servers[hung].log})\n"
                  f"{log_tail(servers[hung].log)}", file=sys.stderr)
            return 3
        time.sleep(0.5)
