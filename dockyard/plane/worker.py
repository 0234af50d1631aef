"""`dockyard rollout-worker`: a rollout worker of a data-plane run, a job of its own.

It starts its generation server(s) on this node (the config's backend, cluster.rollout's servers per
node), joins the plane, and until the run announces its end:

    newest weights announced? load them -> take a prompt -> sample and score its group -> push it

Pushing the group, acknowledging its prompt and counting it happen in one transaction. A prompt a
worker holds longer than data_plane.claim_after_s (it died, or its node was lost) is claimed by the
next worker that asks; a worker stopped by a signal (scancel, preemption, time limit) hands its
prompt back at once. Nothing the trainer does waits on a particular worker.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

from dockyard import registry
from dockyard.config import topology
from dockyard.config.loader import LoadedConfig
from dockyard.errors import ComponentError, DockyardError
from dockyard.generation.fleet import GeneratorFleet
from dockyard.generation.generator import GenerationServerError
from dockyard.generation.health import wait_until_healthy
from dockyard.loop.prompt_codec import PromptCodec
from dockyard.plane.broker import Broker, WaitCancelled
from dockyard.preflight.components import plane_client_problems
from dockyard.plane.feed import GROUPS, PROMPTS, WORKERS, ensure_groups
from dockyard.plane.messages import decode_prompt, encode_trajectories, sampling_settings, settings_differences
from dockyard.plane.weights import Announcement, announced
from dockyard.processes import STOP_SIGNALS, log_tail, start_server, stop_processes

HEARTBEAT_S = 5
MAX_DELIVERIES = 3   # a prompt claimed from silent workers this often is set aside (_set_aside_if_poison)
HEARTBEAT_TTL_S = 20
SERVER_START_TIMEOUT_S = float(os.environ.get("DOCKYARD_ENGINE_HEALTH_TIMEOUT_S", 600))


def worker_id() -> str:
    job = os.environ.get("SLURM_JOB_ID")
    return f"{socket.gethostname()}-{'job' + job if job else 'pid' + str(os.getpid())}"


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


class RolloutWorker:
    def __init__(self, cfg, name: str, log_dir: Path, max_groups: int | None = None):
        self.cfg, self.name, self.log_dir, self.max_groups = cfg, name, log_dir, max_groups
        self.stopping = threading.Event()
        self.version: int | None = None
        self.serving: Announcement | None = None   # the publication its servers hold
        self.groups = 0
        self.held: list[tuple[str, dict]] = []   # prompts taken and not yet answered
        self.servers: list = []
        self.broker: Broker | None = None

    # --- set-up -----------------------------------------------------------------------------

    def start_servers(self) -> GeneratorFleet:
        cfg = self.cfg
        backend = cfg.policy.generation.backend
        count = max(1, topology.server_tasks_per_node(cfg, "rollout"))
        clients = []
        for index in range(count):
            launcher = registry.build("generation_backend", backend, config=cfg)
            log = self.log_dir / f"engine_{index}.log"
            child, url = start_server(launcher, f"{self.name} server {index} ({backend})", log,
                                      dict(cfg.cluster.rollout.env), index, count, os.cpu_count() or 1)
            self.servers.append(child)
            clients.append(launcher.client(url, child.name, log, request_timeout_s=cfg.grpo.sampler.rollout_timeout_s))
        say(f"dockyard rollout-worker {self.name}: starting {count} {backend} server(s) (logs in {self.log_dir})")
        wait_until_healthy(clients, SERVER_START_TIMEOUT_S)
        return GeneratorFleet(clients, name=f"{self.name} fleet")

    def run(self) -> int:
        cfg = self.cfg
        self.broker = b = Broker(cfg, who=f"dockyard rollout-worker {self.name}")
        b.cancelled = self.stopping.is_set
        ensure_groups(b)
        self._same_settings_as_the_run()   # before minutes of server start-up
        self.fleet = self.start_servers()
        env = registry.build("environment", cfg.env.name, config=cfg.env)
        self.codec = PromptCodec(cfg, env)
        self.collector = self.codec.collector([], self._generate)
        b.call("joining", lambda: b.redis.hincrby(b.key("counters"), "joined", 1))
        beat = threading.Thread(target=self._heartbeat, daemon=True, name="heartbeat")
        beat.start()
        say(f"dockyard rollout-worker {self.name}: joined the plane at {b.address} (namespace {b.ns})")
        try:
            self._loop()
        except WaitCancelled:
            pass   # stopped during a broker outage
        finally:
            self._leave()
        return 0

    def _loop(self) -> None:
        b = self.broker
        while not self.stopping.is_set():
            self._check_servers()
            if b.call("reading the run's state", lambda: b.redis.hget(b.key("state"), "finished")):
                say(f"dockyard rollout-worker {self.name}: the run has finished; leaving")
                break
            if not self._follow_weights():
                self.stopping.wait(1.0)
                continue
            tasks = self._take()
            if tasks:
                self._follow_weights()   # weights announced while it waited for prompts go in first
            try:
                if tasks:
                    self._answer(tasks)
            except Exception:
                if self.stopping.is_set():   # requests aborted by the stop: the prompts go back
                    break
                raise
            if self.max_groups is not None and self.groups >= self.max_groups:
                break

    def _same_settings_as_the_run(self) -> None:
        """A worker started with other sampling settings than the trainer's (another config, other
        overrides) is refused, naming the fields, before it pushes anything."""
        b = self.broker
        saved = b.call("reading the run's settings", lambda: b.redis.hget(b.key("state"), "sampling"))
        if saved is None:
            return   # the trainer has not opened the plane yet; it writes its settings when it does
        differences = settings_differences(json.loads(saved), json.loads(json.dumps(sampling_settings(self.cfg))))
        if differences:
            raise ComponentError(f"rollout worker {self.name}: its config samples differently from the run's "
                                 f"(start it with the run's config, <log_dir>/config.yaml): {'; '.join(differences)}")

    # --- the loop's parts -------------------------------------------------------------------

    def _generate(self, prompt_ids, params, images=None):
        version = self.version
        completions = self.fleet.generate(prompt_ids, params, images) if images is not None \
            else self.fleet.generate(prompt_ids, params)
        return [replace(c, versions=[version] * len(c.token_ids)) for c in completions]

    def _check_servers(self) -> None:
        for child in self.servers:
            if child.process.poll() is not None:
                raise ComponentError(f"rollout worker {self.name}: {child.describe()} exited with status "
                                     f"{child.process.returncode}\n{log_tail(child.log)}")

    def _follow_weights(self) -> bool:
        """Load the announced weights if they are not the ones served; False before any announcement."""
        got = announced(self.broker)
        if got is None:
            return False
        if self.version is None:
            self._same_settings_as_the_run()   # a worker that joined before the trainer is checked now
        if got != self.serving:
            started = time.perf_counter()
            try:
                self.fleet.load_weights_from_disk(got.path)
            except GenerationServerError as err:
                if announced(self.broker) != got:   # replaced or pruned meanwhile: read the announcement again
                    return False
                raise ComponentError(f"rollout worker {self.name}: its servers cannot load weights version "
                                     f"{got.version} from {got.path}: {err}") from None
            self.serving, self.version = got, got.version
            say(f"dockyard rollout-worker {self.name}: serving weights version {got.version} "
                f"({time.perf_counter() - started:.1f} s to load)")
        return True

    def _take(self) -> list[tuple[str, dict]]:
        b, want = self.broker, len(self.fleet.replicas)
        claim_ms = int(self.cfg.data_plane.claim_after_s * 1000)
        # a prompt left by a worker that went away without a word comes first
        claimed = b.call("claiming abandoned prompts", lambda: b.redis.xautoclaim(
            b.key(PROMPTS), WORKERS, self.name, min_idle_time=claim_ms, start_id="0-0", count=want))
        tasks = [(i, f) for i, f in claimed[1] if f and not self._set_aside_if_poison(i, f)]
        if tasks:
            say(f"dockyard rollout-worker {self.name}: took over {len(tasks)} prompt(s) held past "
                f"data_plane.claim_after_s by a worker that went away")
        if not tasks:
            got = b.call("waiting for prompts", lambda: b.redis.xreadgroup(
                WORKERS, self.name, {b.key(PROMPTS): ">"}, count=want, block=1000))
            tasks = [(i, f) for _, entries in (got or []) for i, f in entries if f]
        self.held = list(tasks)
        return tasks

    def _set_aside_if_poison(self, entry_id: str, fields: dict) -> bool:
        """A prompt whose workers went away without a word MAX_DELIVERIES times is taken to be what ends
        them (a scorer or sandbox that brings the node down): set aside, named, and counted, instead of
        being handed round the fleet forever. The trainer no longer waits for it."""
        b = self.broker
        pending = b.call("reading a prompt's deliveries", lambda: b.redis.xpending_range(
            b.key(PROMPTS), WORKERS, min=entry_id, max=entry_id, count=1))
        if not pending or pending[0]["times_delivered"] <= MAX_DELIVERIES:
            return False
        pipe = b.redis.pipeline(transaction=True)
        pipe.xack(b.key(PROMPTS), WORKERS, entry_id)
        pipe.xdel(b.key(PROMPTS), entry_id)
        pipe.hset(b.key("set_aside"), fields["n"], fields["row"])
        pipe.hdel(b.key("outstanding"), fields["n"])
        pipe.hincrby(b.key("counters"), "set_aside", 1)
        b.call("setting a prompt aside", pipe.execute)
        say(f"dockyard rollout-worker {self.name}: set aside prompt {fields['n']} (dataset row {fields['row']}): "
            f"the workers that took it went away without a word {pending[0]['times_delivered'] - 1} times")
        return True

    def _answer(self, tasks: list[tuple[str, dict]]) -> None:
        b, version = self.broker, self.version
        prompts = [decode_prompt(f["prompt"]) for _, f in tasks]
        started = time.perf_counter()
        groups = []
        for (_, fields), prompt in zip(tasks, prompts):
            groups += self.collector.sample_groups([prompt], int(fields["seed"]))
        seconds = time.perf_counter() - started
        if self.stopping.is_set():
            return   # aborted requests: _leave hands the prompts back
        pipe = b.redis.pipeline(transaction=True)
        for (entry_id, fields), group in zip(tasks, groups):
            pipe.xadd(b.key(GROUPS), {"n": fields["n"], "row": fields["row"], "version": version,
                                      "worker": self.name, "seconds": seconds / len(tasks),
                                      "trajectories": encode_trajectories(group)})
            pipe.xack(b.key(PROMPTS), WORKERS, entry_id)
            pipe.xdel(b.key(PROMPTS), entry_id)
            pipe.hincrby(b.key("counters"), "produced", 1)
        b.call("pushing groups", pipe.execute)
        self.held = []
        self.groups += len(groups)

    def _heartbeat(self) -> None:
        b = self.broker
        while not self.stopping.is_set():
            try:
                key = b.key(f"worker:{self.name}")
                pipe = b.redis.pipeline(transaction=True)
                pipe.hset(key, mapping={"version": -1 if self.version is None else self.version,
                                        "host": socket.gethostname(), "pid": os.getpid(), "groups": self.groups})
                pipe.expire(key, HEARTBEAT_TTL_S)
                pipe.execute()
            except Exception:   # an outage: the main loop waits it out and says so
                pass
            self.stopping.wait(HEARTBEAT_S)

    def _leave(self) -> None:
        self.stopping.set()
        b = self.broker
        if b is not None:
            try:
                if self.held:   # handed back now instead of after claim_after_s
                    pipe = b.redis.pipeline(transaction=True)
                    for entry_id, fields in self.held:
                        pipe.xadd(b.key(PROMPTS), fields)
                        pipe.xack(b.key(PROMPTS), WORKERS, entry_id)
                        pipe.xdel(b.key(PROMPTS), entry_id)
                    pipe.execute()
                    say(f"dockyard rollout-worker {self.name}: handed {len(self.held)} prompt(s) back")
                pipe = b.redis.pipeline(transaction=True)
                pipe.delete(b.key(f"worker:{self.name}"))
                pipe.hincrby(b.key("counters"), "left", 1)
                pipe.execute()
            except Exception as err:   # the broker is gone: the prompts come back after claim_after_s
                say(f"dockyard rollout-worker {self.name}: could not say goodbye to the broker ({err})")
        stop_processes((child.process for child in self.servers), 30)
        say(f"dockyard rollout-worker {self.name}: left after {self.groups} group(s)")

    def stop(self) -> None:
        """A signal: requests in flight end now; the prompts held go back."""
        self.stopping.set()
        try:
            self.fleet.abort()
        except Exception:
            pass


def run_worker(loaded: LoadedConfig, name: str | None = None, max_groups: int | None = None) -> int:
    return run_worker_config(loaded.config, str(loaded.source), name, max_groups)


def run_worker_config(cfg, source: str, name: str | None = None, max_groups: int | None = None) -> int:
    if cfg.data_plane is None:
        say(f"dockyard rollout-worker: {source} has no data_plane section; a worker joins a data-plane run")
        return 2
    problems = plane_client_problems(cfg)
    if problems:
        for problem in problems:
            say(f"dockyard rollout-worker: {problem}")
        return 2
    name = name or worker_id()
    log_dir = Path(cfg.logger.log_dir) / "workers" / name
    log_dir.mkdir(parents=True, exist_ok=True)
    worker = RolloutWorker(cfg, name, log_dir, max_groups)
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR2, signal.SIGHUP):
        signal.signal(signum, lambda s, f: threading.Thread(target=worker.stop, daemon=True).start())
    # a Slurm job starts guarded (launch/startup_guard.py): the stop signals wait, blocked, until now
    signal.pthread_sigmask(signal.SIG_UNBLOCK, set(STOP_SIGNALS))
    try:
        return worker.run()
    except WaitCancelled as waited:   # a stop while it waited for the broker, before it joined
        say(f"dockyard rollout-worker {name}: stopped while {waited}; it had not joined")
        return 0
    except DockyardError as err:
        say(f"dockyard rollout-worker {name}: {err.report()}")
        return err.exit_status
    finally:
        stop_processes((child.process for child in worker.servers), 30)
