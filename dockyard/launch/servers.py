"""Generation (and teacher) servers inside the Slurm job, started by the driver (trainer rank 0).

Each server is its own `srun --het-group=k` step pinned to one node: its own log file, its own
lifetime (the driver can stop and restart it, e.g. after a requeue), and an exit the driver sees as
the srun process ending. A server binds a port the OS picks and writes it to an address file in the
job folder; the driver waits for that file and /health with a deadline, and fails at once, naming
the server, its node and its log, if the step ends first.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import _thread
from dataclasses import dataclass, field
from pathlib import Path

from dockyard import registry
from dockyard.launch.containers import step_container
from dockyard.config.schema import MasterConfig
from dockyard.errors import ComponentError
from dockyard.generation.generator import ServerClient
from dockyard.generation.generator import GenerationServerError
from dockyard.launch.allocation import Allocation
from dockyard.config.job_plan import JobPlan, ServerGroup
from dockyard.launch.startup_guard import signals_blocked
from dockyard.loop.stopping import NoStops, StopRequests
from dockyard.processes import core_share, log_tail, stop_processes

# srun reads these from its environment as if they were options; inside the trainer's step they
# describe that step and would shape (or break) the server's step.
_STEP_VARIABLES = re.compile(r"^(SLURM_(NTASKS|NPROCS|NNODES|NTASKS_PER_\w+|CPUS_PER_TASK|GPUS\w*|MEM_PER_\w+|"
                             r"DISTRIBUTION|CPU_BIND\w*|STEP_\w+|SRUN_COMM_\w+|EXACT|OVERLAP|TASKS_PER_NODE|"
                             r"PROCID|LOCALID|NODEID|GTIDS|TASK_PID|CPUS_ON_NODE|LAUNCH_NODE_IPADDR|PRIO_PROCESS|"
                             r"UMASK|DISTRIBUTION|SPANK_\w+)|CUDA_VISIBLE_DEVICES|ROCR_VISIBLE_DEVICES|"
                             r"GPU_DEVICE_ORDINAL|SUBMITIT_\w+)$")
STOP_GRACE_S = 20


class ServerFailed(ComponentError, RuntimeError):
    pass


@dataclass
class ServerStep:
    name: str
    role: str
    node: str
    process: subprocess.Popen
    log: Path
    address_file: Path
    url: str | None = None
    teacher: str | None = None   # the teacher a teacher server serves
    stops_on_usr1: bool = False   # a podman step: USR1 stops and removes its container (podman_step.sh)

    def describe(self) -> str:
        return f"{self.name} on node {self.node} (srun pid {self.process.pid}, log: {self.log})"

    def tail(self, lines: int = 15) -> str:
        if not self.log.is_file():
            return "    | (no log written)"
        return log_tail(self.log, lines) or "    | (empty log)"


def step_environment(base: dict, extra: dict[str, str]) -> dict:
    env = {k: v for k, v in base.items() if not _STEP_VARIABLES.match(k)}
    env.update(extra)
    return env


def srun_command(cfg: MasterConfig, group: ServerGroup, node: str, het: bool, gpus: int, log: Path,
                 cpus: int | None = None, job_folder: Path | None = None) -> list[str]:
    """One server's step. Several servers on a node take `--exact` shares (`cpus` each when known):
    a step otherwise gets every CPU of the allocation there and the next server's step waits forever."""
    cmd = ["srun", "--nodes=1", "--ntasks=1", f"--nodelist={node}", f"--output={log}", "--kill-on-bad-exit=1",
           f"--job-name={group.role}"]
    if het:
        cmd.append(f"--het-group={group.het_group}")
    if group.overlap:
        cmd.append("--overlap")   # shares the trainer's nodes (colocate)
    else:
        if group.tasks_per_node > 1:
            cmd.append("--exact")
            if cpus:
                cmd.append(f"--cpus-per-task={cpus}")
        if gpus > 0:
            cmd.append(f"--gpus-per-task={gpus}")
    container = step_container(cfg, group.role, job_folder)
    if container is not None:
        cmd += container.srun_flags(job_folder)
    return cmd


def step_cpus(alloc: Allocation, group: ServerGroup) -> int | None:
    """CPUs of one server's step: the component's CPUs on a node ("8" or "8(x2)") over its servers there."""
    key = f"SLURM_JOB_CPUS_PER_NODE_HET_GROUP_{group.het_group}" if alloc.het_size > 1 else "SLURM_JOB_CPUS_PER_NODE"
    match = re.match(r"\d+", alloc.env.get(key, ""))
    return max(1, int(match.group()) // group.tasks_per_node) if match else None


def start_servers(cfg: MasterConfig, plan: JobPlan, alloc: Allocation, folder: Path, role: str = "rollout",
                  teacher_folders: dict[str, str] | None = None) -> list[ServerStep]:
    """The role's servers as srun steps. Rollout: every slot of its group (nodes x tasks per node).
    Teacher: one server per (teacher, replica) of loop/teachers.py, spread over the group's nodes, each
    loading its teacher's folder (`teacher_folders`); several on a node take --exact shares."""
    group = plan.server_group(role)
    if group is None:
        return []
    nodes = alloc.nodes(group.het_group)[:group.nodes]
    backend = cfg.policy.generation.backend
    if role == "teacher":
        from dockyard.config.topology import teacher_servers

        tp = cfg.on_policy_distillation.parallelism.tensor_parallel_size if cfg.cluster.gpus_per_node > 0 else None
        wanted = teacher_servers(cfg)
        per_node = -(-len(wanted) // len(nodes))
        placed = [(nodes[i // per_node], (f"teacher {name}" + (f" replica {index}" if index else ""), name),
                   registry.build("generation_backend", backend, config=cfg, model_path=teacher_folders[name],
                                  tensor_parallel_size=tp)) for i, (name, index) in enumerate(wanted)]
        gpus = (tp or 0) if cfg.cluster.gpus_per_node > 0 else 0
        if per_node != group.tasks_per_node:
            group = dataclasses.replace(group, tasks_per_node=per_node)
    else:
        server = registry.build("generation_backend", backend, config=cfg)
        placed = [(node, (None, None), server) for node in nodes for _ in range(group.tasks_per_node)]
        gpus = cfg.cluster.rollout_gpus_per_replica if cfg.cluster.gpus_per_node > 0 else 0
    cpus = os.cpu_count() or 1
    threads = max(1, cpus // group.tasks_per_node) if not group.overlap else max(1, cpus // 2)
    steps = []
    for index, (node, (label, teacher), server) in enumerate(placed):
        slot = sum(1 for other, _, _ in placed[:index] if other == node)
        stem = f"{alloc.incarnation}_{role}{index}"
        log, address_file = folder / f"{stem}_{node}.log", folder / f"{stem}.address.json"
        address_file.unlink(missing_ok=True)
        # servers sharing a node are bound to cores of their own (slot k of tasks_per_node)
        bind = None if group.tasks_per_node == 1 else core_share(slot, group.tasks_per_node, cpus)[0]
        extra = {**server.environment(bind), **getattr(cfg.cluster, role).env}
        serve = server.command(port=0, host="0.0.0.0", threads=threads, address_file=str(address_file))
        # USR2 (the trainer's warning signal; Slurm sends it to every step, possibly while the server
        # is still importing) must not kill a server: ignored from before exec, which it inherits
        container = step_container(cfg, role, folder)
        program = container.server_command(serve) if container is not None else [
            "bash", "-c", 'trap "" USR2; exec "$@"', "dockyard-server", *serve]
        command = srun_command(cfg, group, node, alloc.het_size > 1, gpus, log, step_cpus(alloc, group),
                               folder) + program
        # the srun client itself runs in the trainer's step, which the warning signal reaches too: its
        # default action ended srun while the server started (exit -12); it inherits USR2 blocked
        with signals_blocked({signal.SIGUSR2}):
            process = subprocess.Popen(command, env=step_environment(alloc.env, extra), stdin=subprocess.DEVNULL,
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        steps.append(ServerStep(label or f"{role} server {index}", role, node, process, log, address_file,
                                teacher=teacher, stops_on_usr1=container is not None and container.runtime == "podman"))
    return steps


def wait_ready(steps: list[ServerStep], timeout_s: float) -> None:
    """Every server has published its address and answers /health, or ServerFailed names the one that did not."""
    deadline = time.monotonic() + timeout_s
    for step in steps:
        while step.url is None:
            if step.process.poll() is not None:
                raise ServerFailed(f"{step.describe()} exited with status {step.process.returncode} before "
                                   f"it was ready\n{step.tail()}")
            if step.address_file.is_file():
                port = json.loads(step.address_file.read_text())["port"]
                step.url = f"http://{step.node}:{port}"
                break
            if time.monotonic() > deadline:
                raise ServerFailed(f"{step.describe()} did not start listening within {timeout_s:.0f} s "
                                   f"(cluster.slurm.server_health_timeout_s)\n{step.tail()}")
            time.sleep(0.2)
        client = ServerClient(step.url, name=step.name, log_path=step.log)
        try:
            client.wait_healthy(max(1.0, deadline - time.monotonic()), step.process)
        except GenerationServerError as err:
            raise ServerFailed(f"{step.describe()}: {err}\n{step.tail()}") from None
        finally:
            client.close()


def replica_clients(cfg: MasterConfig, steps: list[ServerStep]) -> list:
    """Clients of the started servers (for health probes), of the configured backend."""
    server = registry.build("generation_backend", cfg.policy.generation.backend, config=cfg)
    return [server.client(step.url, f"{step.name} on node {step.node}", step.log) for step in steps]


def stop_servers(steps: list[ServerStep]) -> None:
    # srun answers a SIGTERM by killing its step, which ends a server but not a podman container (its
    # conmon has left the step): those steps get USR1 first, which srun forwards and podman_step.sh
    # takes as "stop and remove the container"
    wrapped = [step.process for step in steps if step.stops_on_usr1 and step.process.poll() is None]
    for process in wrapped:
        process.send_signal(signal.SIGUSR1)
    deadline = time.monotonic() + STOP_GRACE_S
    for process in wrapped:
        try:
            process.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    stop_processes((step.process for step in steps), STOP_GRACE_S)


def dead_server(steps: list[ServerStep], grace_s: float = 5.0) -> str | None:
    """The first server whose step has ended, waiting up to grace_s for srun to notice: when the trainer
    fails talking to a server (HTTP, or the weight broadcast), a dead server is the cause to report."""
    deadline = time.monotonic() + grace_s
    while True:
        for step in steps:
            if step.process.poll() is not None:
                return (f"{step.describe()} exited with status {step.process.returncode} during the run; "
                        f"ending the job\n{step.tail()}")
        if time.monotonic() > deadline:
            return None
        time.sleep(0.2)


# A server step that ended by SIGTERM is most often the job's own requeue, preemption or cancel reaching it
# first: in a job container the trainer's signal comes through its runtime (podman_step.sh stops the
# container with a podman call of its own) and can arrive seconds later, under load more than 10.
TERMINATED = (128 + signal.SIGTERM, -signal.SIGTERM)
TERMINATED_GRACE_S = 25.0


@dataclass
class ServerWatch:
    """Ends the trainer when a server dies mid-run: the main thread gets KeyboardInterrupt (it may be
    blocked far from any HTTP call, e.g. in a long backward pass); if it has not unwound after
    `hard_exit_s`, the process exits. Either way the message names the server, node and log."""

    steps: list[ServerStep]
    stopper: StopRequests = field(default_factory=NoStops)   # once a stop is under way, servers going away is expected
    clients: list = field(default_factory=list)   # one per step: a live step that stops answering /health is hung
    hard_exit_s: float = 30.0
    terminated_grace_s: float = TERMINATED_GRACE_S
    failure: str | None = None
    _stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> "ServerWatch":
        threading.Thread(target=self._run, name="server-watch", daemon=True).start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        from dockyard.generation.health import HealthProbe

        health = HealthProbe(self.clients) if self.clients else None
        while not self._stop.wait(1.0):
            for step in self.steps:
                code = step.process.poll()
                if code is not None and self.stopper.requested:
                    return
                if code is not None and not self._stop.is_set():
                    if code in TERMINATED and self._stop_follows(self.terminated_grace_s):
                        return
                    return self._fail(f"{step.describe()} exited with status {code} during the run; "
                                      f"ending the job\n{step.tail()}")
            hung = health.hung() if health is not None else None
            if hung is not None and not self._stop.is_set() and not self.stopper.requested:
                step = self.steps[hung]
                return self._fail(f"{health.describe(hung)}: {step.describe()}; ending the job\n{step.tail()}")

    def _stop_follows(self, grace_s: float) -> bool:
        """Whether the trainer's own stop request (or the end of the watch) comes within grace_s."""
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            if self.stopper.requested or self._stop.wait(0.2):
                return True
        return self.stopper.requested

    def _fail(self, failure: str) -> None:
        self.failure = failure
        print(f"dockyard: {self.failure}", file=sys.stderr, flush=True)
        _thread.interrupt_main()
        if not self._stop.wait(self.hard_exit_s):
            print("dockyard: the trainer did not stop in time; exiting", file=sys.stderr, flush=True)
            os._exit(3)
