"""Trainer rank 0's end of the data plane: prompts out to the workers, finished groups in, each group
acknowledged only once the step that trained it is checkpointed.

Keys under the run's namespace (broker.namespace):
    prompts       stream, consumer group `workers`: {n, row, seed, prompt}
    groups        stream, consumer group `trainer`: {n, row, version, worker, seconds, trajectories}
    outstanding   hash n -> row: prompts handed out whose group no checkpoint holds yet
    state         hash: run (the checkpoint folder that owns the namespace), loader, next_n,
                  weights_version, weights_path
    counters      hash: produced, trained, stale, duplicate, published, joined, left, set_aside
    set_aside     hash n -> row: prompts whose workers kept dying without a word (worker.py)
    worker:<id>   hash with a TTL: a live worker's heartbeat (worker.py)

Exactly once: the trainer reads a group (it becomes pending in the `trainer` group), trains on it,
and acknowledges it, with the prompt's entry in `outstanding`, after the checkpoint of that step is
written (the ids go into the checkpoint first: a crash between the two acknowledges them on resume).
A trainer that dies before the checkpoint leaves its groups pending; the next one reads them back
first, in the order it had read them. A group whose prompt number it has already read (a worker
presumed dead delivered after all, or a retried write) is a duplicate, dropped and counted; one too
stale for the lag bound (or sampled by weights a resumed run discarded) is dropped, counted, and its
prompt handed out again.
"""

from __future__ import annotations

import json
import math
import time
from typing import Callable

from dockyard.data.datasets import PromptLoader
from dockyard.errors import ComponentError
from dockyard.loop.rollout_window import pipeline_capacity
from dockyard.loop.rollouts import Group
from dockyard.plane.broker import Broker, WaitCancelled
from dockyard.plane.messages import decode_group, encode_prompt, sampling_settings

PROMPTS, GROUPS, WORKERS, TRAINER = "prompts", "groups", "workers", "trainer"
CONSUMER = "trainer"

# XACK + XDEL the given group ids, HDEL their prompt numbers, count the newly acknowledged under a
# counter: atomic, so a crash never leaves a group acknowledged but uncounted
_SETTLE = """
local acked = 0
if #ARGV > 3 then
  local ids = {}
  for i = 4, 3 + tonumber(ARGV[3]) do ids[#ids + 1] = ARGV[i] end
  if #ids > 0 then
    acked = redis.call('XACK', KEYS[1], ARGV[1], unpack(ids))
    redis.call('XDEL', KEYS[1], unpack(ids))
  end
  local numbers = {}
  for i = 4 + tonumber(ARGV[3]), #ARGV do numbers[#numbers + 1] = ARGV[i] end
  if #numbers > 0 then redis.call('HDEL', KEYS[3], unpack(numbers)) end
end
redis.call('HINCRBY', KEYS[2], ARGV[2], acked)
return acked
"""


class RunMismatch(ComponentError):
    label = "data plane"


def ensure_groups(broker: Broker) -> None:
    import redis

    for stream, group in ((PROMPTS, WORKERS), (GROUPS, TRAINER)):
        try:
            broker.call(f"creating the consumer group {group}",
                        lambda: broker.redis.xgroup_create(broker.key(stream), group, id="0", mkstream=True))
        except redis.ResponseError as err:
            if "BUSYGROUP" not in str(err):
                raise


class PlaneFeed:
    def __init__(self, cfg, broker: Broker, loader: PromptLoader, log: Callable[[str], None]):
        grpo, a = cfg.grpo, cfg.grpo.async_grpo
        self.cfg, self.broker, self.loader, self.log = cfg, broker, loader, log
        self.batch, self.group_size = grpo.num_prompts_per_step, grpo.num_generations_per_prompt
        self.max_lag = math.ceil(a.max_staleness_steps)
        # open prompts at once: the async pipeline's capacity, within data_plane.buffer_size trajectories
        self.capacity = max(self.batch, min(pipeline_capacity(self.batch, a.max_staleness_steps),
                                            cfg.data_plane.buffer_size // self.group_size))
        self.settle_script = broker.redis.register_script(_SETTLE)
        self.backlog: list[tuple[str, dict]] = []   # pending entries read back after a restart
        self.received: dict[int, str] = {}          # prompt number -> group id, read and not yet acknowledged
        self.taken: list[tuple[str, int, int]] = []     # (id, n, row) of the step being trained
        self.trained: list[tuple[str, int, int]] = []   # trained, acknowledged at the next checkpoint
        self.last_lags: list[int] = []
        self.last_rows: list[int] = []
        self.step_counts = {"stale": 0, "duplicate": 0}
        self.step_started = time.monotonic()
        self.worker_seconds = 0.0

    # --- start ------------------------------------------------------------------------------

    def open(self, checkpoint_dir: str, saved: dict | None) -> None:
        """Claim the namespace for this run, settle what the checkpoint trained, read back what is pending."""
        b = self.broker
        ensure_groups(b)
        owner = b.call("reading the run's state", lambda: b.redis.hget(b.key("state"), "run"))
        if owner is not None and owner != checkpoint_dir:
            raise RunMismatch(f"the broker at {b.address} holds namespace {b.ns!r} of another run (checkpoints in "
                              f"{owner}); set data_plane.namespace, or delete its keys (redis-cli --scan "
                              f"--pattern '{b.ns}:*' | xargs redis-cli del)")
        b.call("claiming the namespace", lambda: b.redis.hset(b.key("state"), mapping={
            "run": checkpoint_dir, "sampling": json.dumps(sampling_settings(self.cfg))}))
        b.call("reopening the run", lambda: b.redis.hdel(b.key("state"), "finished"))
        if saved:
            ids, numbers = saved.get("ids", []), saved.get("numbers", [])
            done = self._settle(ids, numbers, "trained")
            if done:
                self.log(f"dockyard: data plane: acknowledged {done} group(s) the checkpoint holds (the run "
                         "stopped between the checkpoint and their acknowledgement)")
        loader = b.call("reading the prompt loader's position", lambda: b.redis.hget(b.key("state"), "loader"))
        if loader is not None:
            self.loader.load_state_dict(json.loads(loader))   # ahead of the checkpoint's: those prompts are out
        pending = b.call("reading back pending groups", lambda: b.redis.xreadgroup(
            TRAINER, CONSUMER, {b.key(GROUPS): "0"}, count=100_000))
        self.backlog = [(entry_id, fields) for _, entries in (pending or []) for entry_id, fields in entries if fields]
        if self.backlog:
            self.log(f"dockyard: data plane: {len(self.backlog)} group(s) read but not checkpointed before the "
                     "stop are trained again first")

    # --- prompts out ------------------------------------------------------------------------

    def _in_flight(self) -> int:
        b = self.broker
        return b.call("counting open prompts", lambda: b.redis.hlen(b.key("outstanding"))) - len(self.received)

    def top_up(self, in_hand: int = 0) -> None:
        """Hand out prompts until `capacity` are open (out to workers or delivered, not yet read), less
        the groups this step already holds: as the async driver's start gate (rollout_window.py), a
        prompt handed out now is then read by a step within the lag bound of today's weights, unless
        slower groups overtake it."""
        for _ in range(max(0, self.capacity - in_hand - self._in_flight())):
            self._publish(self.loader.take_rows(1)[0])

    def _publish(self, row: int, settle: tuple | None = None) -> None:
        b = self.broker

        def send():
            n = int(b.redis.hincrby(b.key("state"), "next_n", 1))
            pipe = b.redis.pipeline(transaction=True)
            if settle is not None:
                self.settle_script(keys=self._settle_keys(), args=settle, client=pipe)
            pipe.xadd(b.key(PROMPTS), {"n": n, "row": row, "seed": self.cfg.policy.seed * 1_000_003 + n * 7_919,
                                       "prompt": encode_prompt(self.loader.prompts[row])})
            pipe.hset(b.key("outstanding"), n, row)
            pipe.hset(b.key("state"), "loader", json.dumps(self.loader.state_dict()))
            pipe.hincrby(b.key("counters"), "published", 1)
            pipe.execute()

        b.call("handing out a prompt", send)

    # --- groups in --------------------------------------------------------------------------

    def take(self, trainer_version: int, timeout_s: float, stop: Callable[[], bool]) -> list[Group] | None:
        """The step's B groups, in the order they arrive; None when stop() turns true first."""
        b, groups, self.taken = self.broker, [], []
        deadline = time.monotonic() + timeout_s
        b.cancelled = stop
        try:
            return self._take(trainer_version, timeout_s, stop, groups, deadline)
        except WaitCancelled:
            return None
        finally:
            b.cancelled = lambda: False

    def _take(self, trainer_version, timeout_s, stop, groups, deadline):
        b = self.broker
        while len(groups) < self.batch:
            if stop():
                return None
            self.top_up(len(groups))
            if self.backlog:
                entries, self.backlog = self.backlog[:self.batch], self.backlog[self.batch:]
            else:
                got = b.call("waiting for groups", lambda: b.redis.xreadgroup(
                    TRAINER, CONSUMER, {b.key(GROUPS): ">"}, count=self.batch - len(groups), block=1000))
                entries = [(i, f) for _, es in (got or []) for i, f in es if f]
            accepted = 0
            for entry_id, fields in entries:
                group = self._accept(entry_id, fields, trainer_version)
                if group is not None:
                    groups.append(group)
                    accepted += 1
            # only a group it can train counts as delivered: workers that deliver nothing but stale
            # groups (weights the run no longer has) must not keep the trainer waiting for ever
            if accepted:
                deadline = time.monotonic() + timeout_s
            elif time.monotonic() > deadline:
                dropped = self.step_counts["stale"] + self.step_counts["duplicate"]
                raise ComponentError(f"data plane: no rollout worker delivered a group for {timeout_s:.0f} s "
                                     f"(data_plane.timeout_s; {self.live_workers()} worker(s) alive, "
                                     f"{len(groups)} of {self.batch} groups in hand"
                                     + (f", {dropped} stale or duplicate dropped" if dropped else "") + ")")
        self.last_lags = [trainer_version - version for *_, version in self.taken]
        self.taken = [(i, n, row) for i, n, row, _ in self.taken]
        self.last_rows = [row for _, _, row in self.taken]
        return groups

    def _accept(self, entry_id: str, fields: dict, trainer_version: int) -> Group | None:
        b = self.broker
        n, row, version = int(fields["n"]), int(fields["row"]), int(fields["version"])
        known = b.call("checking a prompt number", lambda: b.redis.hexists(b.key("outstanding"), n))
        if n in self.received or not known:
            self._settle([entry_id], [], "duplicate")
            self.step_counts["duplicate"] += 1
            return None
        # a version newer than the trainer's was published by a run that stopped before checkpointing it:
        # those weights are gone from the run's history
        if trainer_version - version > self.max_lag or version > trainer_version:
            # dropped in one transaction with handing its prompt out again: nothing lost in between
            self._publish(row, settle=self._settle_args([entry_id], [n], "stale"))
            self.step_counts["stale"] += 1
            return None
        group = decode_group(fields["trajectories"], self.loader.prompts[row],
                             f"group {entry_id} from worker {fields.get('worker')}")
        self.received[n] = entry_id
        self.taken.append((entry_id, n, row, version))
        self.worker_seconds += float(fields.get("seconds", 0.0))
        return group

    # --- after training, after the checkpoint -----------------------------------------------

    def step_trained(self) -> None:
        self.trained += self.taken
        self.taken = []

    def state(self) -> dict:
        """For the checkpoint: the groups it holds, acknowledged once it is written."""
        return {"ids": [i for i, _, _ in self.trained], "numbers": [n for _, n, _ in self.trained]}

    def acknowledge(self) -> None:
        """The checkpoint holding the trained groups is written: they leave the plane."""
        if not self.trained:
            return
        self._settle([i for i, _, _ in self.trained], [n for _, n, _ in self.trained], "trained")
        for _, n, _ in self.trained:
            self.received.pop(n, None)
        self.trained = []

    def _settle_keys(self) -> list[str]:
        b = self.broker
        return [b.key(GROUPS), b.key("counters"), b.key("outstanding")]

    @staticmethod
    def _settle_args(ids: list[str], numbers: list[int], counter: str) -> list:
        return [TRAINER, counter, len(ids), *ids, *numbers]

    def _settle(self, ids: list[str], numbers: list[int], counter: str) -> int:
        return int(self.broker.call(f"acknowledging {counter} groups", lambda: self.settle_script(
            keys=self._settle_keys(), args=self._settle_args(ids, numbers, counter))))

    # --- figures ----------------------------------------------------------------------------

    def live_workers(self) -> int:
        b = self.broker
        return len(b.call("listing live workers", lambda: list(b.redis.scan_iter(match=b.key("worker:*"), count=1000))))

    def counters(self) -> dict[str, int]:
        b = self.broker
        raw = b.call("reading the counters", lambda: b.redis.hgetall(b.key("counters")))
        return {name: int(value) for name, value in raw.items()}

    def accounting(self) -> str:
        """Where every group the workers produced went (bench/data_plane.py ends with this line)."""
        b = self.broker
        c = self.counters()
        produced, trained, stale, duplicate = (c.get(k, 0) for k in ("produced", "trained", "stale", "duplicate"))
        in_flight = b.call("measuring the buffer", lambda: b.redis.xlen(b.key(GROUPS)))
        lost = produced - trained - stale - duplicate - in_flight
        line = (f"produced {produced} = trained {trained} + stale {stale} + duplicate {duplicate} + in flight "
                f"{in_flight}; lost {lost}; workers joined {c.get('joined', 0)}, left {c.get('left', 0)}")
        if c.get("set_aside"):
            rows = b.call("reading set-aside prompts", lambda: b.redis.hvals(b.key("set_aside")))
            line += (f"; {c['set_aside']} prompt(s) set aside after killing their workers (dataset rows "
                     f"{', '.join(sorted(rows, key=int))})")
        return line

    def figures(self) -> dict[str, float]:
        """Per step: the fleet's size and throughput, what was dropped, what is buffered."""
        b = self.broker
        now, elapsed = time.monotonic(), max(time.monotonic() - self.step_started, 1e-9)
        buffered = b.call("measuring the buffer", lambda: b.redis.xlen(b.key(GROUPS)))
        counters = self.counters()
        out = {"plane/workers": float(self.live_workers()), "plane/groups_per_s": len(self.last_rows) / elapsed,
               "plane/stale_groups": float(self.step_counts["stale"]),
               "plane/duplicate_groups": float(self.step_counts["duplicate"]),
               "plane/buffered_groups": float(buffered - len(self.received)),
               "plane/open_prompts": float(self._in_flight()),
               "plane/worker_generation_seconds": self.worker_seconds,
               "plane/workers_joined": float(counters.get("joined", 0)),
               "plane/workers_left": float(counters.get("left", 0))}
        self.step_counts = {"stale": 0, "duplicate": 0}
        self.step_started, self.worker_seconds = now, 0.0
        return out
