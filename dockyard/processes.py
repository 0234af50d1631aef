"""Child processes the drivers start (the local run's engine and ranks, the Slurm driver's server
steps): stopping them within a grace time, and quoting the end of their logs in error messages."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable


def stop_processes(processes: Iterable[subprocess.Popen], grace_s: float) -> None:
    """SIGTERM to every running one, then SIGKILL to those still alive after grace_s. A child that leads
    its own process group (started with start_new_session) is stopped with its whole group: vLLM's
    engine and worker processes outlive a SIGTERM to its API server otherwise (seen: orphaned workers
    holding 600 MB each), so what is left of such a group after the grace time is killed too. That
    holds for a leader that has died already (a killed vLLM API server leaves its engine and workers
    running): a group whose id is the child's pid is the child's, since Linux does not reuse a pid
    while a group of that id lives."""
    processes = list(processes)
    groups = {process.pid for process in processes if _group_alive(process.pid)}

    def send(process: subprocess.Popen, sig: int) -> None:
        try:
            if process.pid in groups:
                os.killpg(process.pid, sig)
            elif process.poll() is None:
                process.send_signal(sig)
        except ProcessLookupError:
            pass

    for process in processes:
        if process.poll() is None or process.pid in groups:
            send(process, signal.SIGTERM)
            send(process, signal.SIGCONT)   # a stopped (hung) process handles the SIGTERM only once continued
    deadline = time.monotonic() + grace_s
    for process in processes:
        try:
            process.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            send(process, signal.SIGKILL)
            process.wait(timeout=10)
    for pgid in groups:   # the leaders are gone; their groups' other members get the rest of the grace time
        while _group_alive(pgid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if _group_alive(pgid):
            os.killpg(pgid, signal.SIGKILL)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


def log_tail(path: Path | None, lines: int = 15) -> str:
    """The last lines of a log, indented for an error message; "" when there is none."""
    if path is None or not path.is_file():
        return ""
    text = path.read_text(errors="replace").splitlines()[-lines:]
    return "\n".join("    | " + line for line in text)


def core_share(index: int, count: int, cores: int) -> tuple[str, int]:
    """The cores server `index` of `count` on one machine is bound to ("a-b") and its thread count:
    servers that share a core run at half speed each (measured with two vLLM servers on 2 cores)."""
    if count <= 1:
        return f"0-{cores - 1}", cores
    if count > cores:
        core = index % cores
        return str(core), 1
    first, last = index * cores // count, (index + 1) * cores // count - 1
    return (str(first) if first == last else f"{first}-{last}"), last - first + 1


# what Slurm sends a trainer to stop it: USR2 (time-limit warning), SIGTERM (preemption, scancel)
STOP_SIGNALS = {signal.SIGUSR2, signal.SIGTERM}


def publish_address(address_file: str | Path, port: int) -> None:
    """A server's {host, port, pid}, written whole where its driver waits for it (a file renamed into
    place: the driver never reads half of one)."""
    target = Path(address_file)
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_text(json.dumps({"host": socket.gethostname(), "port": port, "pid": os.getpid()}))
    os.replace(tmp, target)


@dataclass
class Child:
    name: str
    process: subprocess.Popen
    log: Path | None

    def describe(self) -> str:
        where = f" (log: {self.log})" if self.log else ""
        return f"{self.name} (pid {self.process.pid}){where}"


def start_server(launcher, name: str, log: Path, extra_env: dict, slot: int, slots: int, cores: int
                 ) -> tuple[Child, str]:
    """A generation server on this machine (`dockyard run`, a rollout worker), bound to its share of the
    cores: the process and its URL."""
    from dockyard.distributed import free_port

    port = free_port()
    cpus, threads = core_share(slot, slots, cores)
    env = {**os.environ, **launcher.environment(cpus), **extra_env}
    with open(log, "w") as handle:
        process = subprocess.Popen(launcher.command(port=port, threads=threads), stdout=handle, env=env,
                                   stderr=subprocess.STDOUT, start_new_session=True)
    return Child(name, process, log), f"http://127.0.0.1:{port}"
