"""`dockyard run`: the GRPO loop on this machine, no Slurm.

Starts the generation server as its own process, waits for /health, then starts the trainer ranks
as torch.distributed processes and watches all of them: if any dies, the others are stopped and
the run ends with a message naming the process and its log file. No hang.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from dockyard import registry
from dockyard.config import topology
from dockyard.config.loader import LoadedConfig, import_folders
from dockyard.distributed import free_port
from dockyard.generation.client import EngineClient, GenerationServerError
from dockyard.loop.support import local_shape, missing_models, unsupported
from dockyard.processes import log_tail, stop_processes

ENGINE_HEALTH_TIMEOUT_S = float(os.environ.get("DOCKYARD_ENGINE_HEALTH_TIMEOUT_S", 600))
SHUTDOWN_GRACE_S = 30


@dataclass
class Child:
    name: str
    process: subprocess.Popen
    log: Path | None

    def describe(self) -> str:
        where = f" (log: {self.log})" if self.log else ""
        return f"{self.name} (pid {self.process.pid}){where}"


class Terminated(Exception):
    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum, self.name = signum, signal.Signals(signum).name


def _raise_terminated(signum, frame) -> None:
    raise Terminated(signum)


def _stop(children: list[Child]) -> None:
    stop_processes((child.process for child in children), SHUTDOWN_GRACE_S)


def run_local(loaded: LoadedConfig) -> int:
    cfg = loaded.config
    problems = unsupported(cfg) + local_shape(cfg) + missing_models(cfg)
    if problems:
        print(f"dockyard run: config {loaded.source} cannot run here ({len(problems)} problem"
              f"{'s' if len(problems) != 1 else ''}):", file=sys.stderr)
        for problem in problems:
            print(f"  - {problem}", file=sys.stderr)
        return 2

    log_dir = Path(cfg.logger.log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    config_file = log_dir / "config.yaml"
    config_file.write_text(loaded.to_yaml())
    world_size = topology.trainer_world_size(cfg)
    cores = os.cpu_count() or 1

    # The children run in sessions of their own (a Ctrl-C reaches only this driver); a SIGTERM or
    # SIGHUP (kill, timeout, a closed terminal) must stop them too instead of leaving them running.
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _raise_terminated)
    engine_port, master_port = free_port(), free_port()
    server = registry.build("generation_backend", cfg.policy.generation.backend, config=cfg)
    engine_log = log_dir / "engine.log"
    children: list[Child] = []
    with open(engine_log, "w") as handle:
        engine = subprocess.Popen(server.command(port=engine_port, threads=cores), stdout=handle,
                                  stderr=subprocess.STDOUT, start_new_session=True)
    children.append(Child("generation server (embedded engine)", engine, engine_log))
    url = f"http://127.0.0.1:{engine_port}"
    try:
        print(f"dockyard run: starting the generation server (log: {engine_log})", file=sys.stderr, flush=True)
        EngineClient(url, name="generation server (embedded engine)", log_path=engine_log).wait_healthy(
            ENGINE_HEALTH_TIMEOUT_S, engine)
        for rank in range(world_size):
            env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank),
                       MASTER_ADDR="127.0.0.1", MASTER_PORT=str(master_port), DOCKYARD_CONFIG=str(config_file),
                       DOCKYARD_ENGINE_URL=url, DOCKYARD_ENGINE_LOG=str(engine_log),
                       DOCKYARD_ENGINE_NAME="generation server (embedded engine)",
                       DOCKYARD_IMPORT_PATH=import_folders(Path(loaded.source)),
                       DOCKYARD_THREADS=str(max(1, cores // world_size)))
            log = None if rank == 0 else log_dir / f"trainer_rank{rank}.log"
            out = None if log is None else open(log, "w")
            process = subprocess.Popen([sys.executable, "-m", "dockyard.loop.grpo"], env=env, stdout=out,
                                       stderr=subprocess.STDOUT if out else None, start_new_session=True)
            children.append(Child(f"trainer rank {rank}", process, log))
        (log_dir / "processes.json").write_text(json.dumps(
            {child.name: {"pid": child.process.pid, "log": str(child.log) if child.log else None}
             for child in children}, indent=2))
        print(f"dockyard run: {world_size} trainer rank(s) started; logs in {log_dir}", file=sys.stderr, flush=True)
        return _supervise(children)
    except GenerationServerError as err:
        print(f"dockyard run: {err}\n{log_tail(engine_log)}", file=sys.stderr)
        return 3
    except KeyboardInterrupt:
        print("dockyard run: interrupted; stopping every process", file=sys.stderr)
        return 130
    except Terminated as stop:
        print(f"dockyard run: received {stop.name}; stopping every process", file=sys.stderr)
        return 128 + stop.signum
    finally:
        for signum in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, signal.SIG_IGN)  # a repeated kill must not cut the stopping short
        _stop(children)


def _supervise(children: list[Child]) -> int:
    """Wait for rank 0 to finish; any process that dies first ends the run, named."""
    engine, ranks = children[0], children[1:]
    while True:
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
        if engine.process.poll() is not None:
            print(f"dockyard run: {engine.describe()} exited with status {engine.process.returncode} "
                  f"during the run; stopping the trainer\n{log_tail(engine.log)}", file=sys.stderr)
            return 3
        time.sleep(0.5)
