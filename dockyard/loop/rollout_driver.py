"""The async rollout driver, on trainer rank 0: keeps the rollout fleet busy while the trainer trains.

A thread of its own starts prompt groups (one generation request per group, so a replica batches
whatever is in flight) within the DispatchWindow's capacity, staleness and window rules; finished
groups are scored and wait in the window until a step takes them. Every sampled token is tagged
with the weights version that sampled it.

Refit: the trainer publishes each step's weights; the driver installs them on every replica between
requests, never under one, so a request's tokens all come from one version:
- partial_rollout false: no request starts while weights wait; the ones in flight finish with the
  weights they started with, then the new weights go in;
- partial_rollout true: requests in flight are aborted at once, the new weights go in, and each
  unfinished sample continues from its last token (prompt + tokens so far) under the new version,
  keeping what was sampled. mask_offpolicy_in_partial_rollout gives the older tokens loss mask 0.

The trainer is never held up by either: it trains on groups already finished.

Checkpoints: groups started but not yet trained are not saved; their prompts are *replayed*
(state() names their rows; after a resume they start first, under the resumed weights), so no
prompt is trained twice and none is lost.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Callable

from dockyard.algorithms.group_filters import FAILED
from dockyard.config.schema import MasterConfig
from dockyard.data.datasets import Prompt, PromptLoader
from dockyard.generation.engine import Completion, SamplingParams
from dockyard.generation.generator import GenerationServerError, Generator
from dockyard.loop.rollout_window import DispatchWindow
from dockyard.loop.rollouts import Group, RolloutCollector, Trajectory

ABORT_RETRY_S = 0.2


@dataclass
class _Slot:
    """One sample of a group, across its partial continuations and retries."""
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    finish_reason: str | None = None     # None while it still has tokens to sample
    attempts: int = 1
    trajectory: Trajectory | None = None

    def reset(self) -> None:
        self.tokens, self.logprobs, self.versions, self.finish_reason = [], [], [], None


@dataclass
class GroupTicket:
    number: int                # start number (DispatchWindow)
    row: int                   # the prompt's row in the loader's dataset
    prompt: Prompt
    prompt_ids: list[int]
    slots: list[_Slot]
    max_tokens: int
    version: int               # weights version it started under
    calls: int = 0
    resumes: int = 0           # samples continued after an abort (partial rollout)
    group: Group | None = None

    @property
    def pending(self) -> list[int]:
        return [i for i, slot in enumerate(self.slots) if slot.finish_reason is None]



class RolloutDriver:
    def __init__(self, cfg: MasterConfig, fleet: Generator, collector: RolloutCollector, loader: PromptLoader,
                 prompt_ids: Callable[[Prompt], list[int]], sampling: Callable[..., SamplingParams],
                 push: Callable[[dict], None], version: int, replay: list[int] | None = None,
                 seed: int = 0):
        a = cfg.grpo.async_grpo
        self.cfg, self.fleet, self.collector, self.loader = cfg, fleet, collector, loader
        self.prompt_ids, self.sampling, self.push = prompt_ids, sampling, push
        self.group_size = cfg.grpo.num_generations_per_prompt
        self.batch = cfg.grpo.num_prompts_per_step
        self.partial, self.mask_offpolicy = a.partial_rollout, a.mask_offpolicy_in_partial_rollout
        self.retry_limit = cfg.grpo.retry_limit
        self.window = DispatchWindow(self.batch, a.max_staleness_steps, a.sliding_window)
        self.version = version
        self.seed = seed
        self.replay = list(replay or [])          # rows to start before drawing new ones
        self.tickets: dict[int, GroupTicket] = {}   # open groups
        self.taken: list[GroupTicket] = []          # taken by a step, not yet trained
        self.continuations: list[GroupTicket] = []  # partial samples waiting for new weights
        self.inflight = 0
        self.pending_weights: tuple[dict, int] | None = None
        self.error: BaseException | None = None
        self.closing = False
        self.cond = threading.Condition()
        self.counters = {"regenerated_groups": 0, "partial_resumes": 0, "refits": 0, "skipped_refits": 0,
                         "refit_seconds": 0.0, "generator_idle_seconds": 0.0}
        self.last_finish = time.monotonic()
        self.last_lags: list[int] = []      # weights versions between sampling and training, per group taken
        self.pool = ThreadPoolExecutor(max_workers=self.window.capacity, thread_name_prefix="rollout")
        self.thread = threading.Thread(target=self._drive, name="rollout-driver", daemon=True)

    def start(self) -> "RolloutDriver":
        self.thread.start()
        return self

    # --- the trainer's side -----------------------------------------------------------------

    def publish(self, weights: dict, version: int) -> None:
        """The trainer's weights after `version` optimizer steps (a newer publish replaces one not
        installed yet)."""
        with self.cond:
            if self.pending_weights is not None:
                self.counters["skipped_refits"] += 1
            self.pending_weights = (weights, version)
            self.cond.notify_all()

    def wait_version(self, version: int, timeout_s: float) -> None:
        """Until the fleet serves `version` (validation measures the weights just trained)."""
        deadline = time.monotonic() + timeout_s
        with self.cond:
            while self.version < version and not self.closing:
                self._raise_error()
                if time.monotonic() > deadline:
                    raise GenerationServerError(f"async GRPO: the rollout fleet did not install weights version "
                                                f"{version} within {timeout_s:.0f} s (it serves {self.version})")
                self.cond.wait(0.5)

    def take(self, trainer_version: int, timeout_s: float, stop: Callable[[], bool] = lambda: False
             ) -> list[Group] | None:
        """The next step's B finished groups for the step that trains `trainer_version`; None when
        `stop()` turns true first. Raises when no group finishes for `timeout_s`."""
        with self.cond:
            while True:
                if stop():
                    return None   # before any error: servers stopped by Slurm with the job fail requests
                self._raise_error()
                for number in self.window.drop_stale(trainer_version):
                    ticket = self.tickets.pop(number)
                    self.replay.insert(0, ticket.row)
                    self.counters["regenerated_groups"] += 1
                    self.cond.notify_all()
                numbers = self.window.take(self.batch)
                if numbers is not None:
                    tickets = [self.tickets.pop(n) for n in numbers]
                    self.taken += tickets
                    self.last_lags = [trainer_version - t.version for t in tickets]
                    self.cond.notify_all()
                    return [t.group for t in tickets]  # type: ignore[misc]
                if time.monotonic() - self.last_finish > timeout_s:
                    raise GenerationServerError(
                        f"async GRPO: waited {timeout_s:.0f} s (grpo.sampler.rollout_timeout_s) for the step's "
                        f"{self.batch} prompt groups and none finished ({len(self.window.finished)} finished, "
                        f"{len(self.tickets) - len(self.window.finished)} running)")
                self.cond.wait(0.5)

    def commit(self) -> None:
        """The taken groups trained: they leave the replay set."""
        with self.cond:
            self.taken = []

    def state(self) -> dict:
        """What a checkpoint keeps: the loader's position and the rows drawn but not trained, in
        start order (replayed first after a resume)."""
        with self.cond:
            rows = [t.row for t in self.taken] + [self.tickets[n].row for n in sorted(self.tickets)] + self.replay
            return {"loader": self.loader.state_dict(), "replay": rows}

    def figures(self) -> dict[str, float]:
        """Counters since the last call, and the buffer's depth now."""
        with self.cond:
            out = {f"async/{name}": float(value) for name, value in self.counters.items()}
            for name in self.counters:
                self.counters[name] = 0 if isinstance(self.counters[name], int) else 0.0
            out["async/buffer_groups"] = float(len(self.window.finished))
            out["async/running_groups"] = float(len(self.tickets) - len(self.window.finished))
            out["async/weights_version"] = float(self.version)
        return out

    def abort(self) -> None:
        """A stop was requested: nothing new starts, requests in flight end now."""
        with self.cond:
            self.closing = True
            self.cond.notify_all()
        self._abort_inflight(timeout_s=30)

    def close(self) -> None:
        self.abort()
        self.thread.join(timeout=30)
        self.pool.shutdown(wait=False, cancel_futures=True)

    # --- the driver thread ------------------------------------------------------------------

    def _raise_error(self) -> None:
        if self.error is not None:
            raise self.error

    def _drive(self) -> None:
        try:
            while True:
                with self.cond:
                    if self.closing:
                        return
                    if self.pending_weights is not None:
                        weights, version = self.pending_weights
                        self.pending_weights = None
                    else:
                        weights = None
                        self._start_groups()
                        idle_since = time.monotonic() if self.inflight == 0 else None
                        self.cond.wait(0.5)
                        if idle_since is not None:
                            self.counters["generator_idle_seconds"] += time.monotonic() - idle_since
                        continue
                self._refit(weights, version)
        except BaseException as err:  # the trainer raises it from take / wait_version
            with self.cond:
                self.error = err
                self.cond.notify_all()

    def _refit(self, weights: dict, version: int) -> None:
        started = time.monotonic()
        if self.partial:
            self._abort_inflight(timeout_s=self.cfg.grpo.sampler.rollout_timeout_s)
        else:
            with self.cond:
                while self.inflight and not self.closing:
                    self._raise_error()
                    self.cond.wait(0.5)
        if self.closing:
            return
        self.push(weights)
        with self.cond:
            self.version = version
            self.counters["refits"] += 1
            self.counters["refit_seconds"] += time.monotonic() - started
            self.cond.notify_all()

    def _abort_inflight(self, timeout_s: float) -> None:
        # an abort can reach a replica just before a request does; repeat until every call returned
        deadline = time.monotonic() + timeout_s
        while True:
            with self.cond:
                if not self.inflight:
                    return
            if time.monotonic() > deadline:
                raise GenerationServerError(f"async GRPO: {self.inflight} generation request(s) did not end "
                                            f"within {timeout_s:.0f} s of an abort")
            try:
                self.fleet.abort()
            except GenerationServerError:
                pass   # a replica going away fails its requests; they return through their callers
            with self.cond:
                self.cond.wait(ABORT_RETRY_S)

    def _start_groups(self) -> None:
        """(cond held) continuations first, then new groups the window admits."""
        for ticket in self.continuations:
            self._submit(ticket)
        self.continuations = []
        for _ in range(self.window.startable(self.version)):
            row = self.replay.pop(0) if self.replay else self.loader.take_rows(1)[0]
            prompt = self.loader.prompts[row]
            number = self.window.start(self.version)
            ids = self.prompt_ids(prompt)
            max_tokens = self.sampling([len(ids)], 1, 0).max_tokens
            ticket = GroupTicket(number, row, prompt, ids, [_Slot() for _ in range(self.group_size)], max_tokens,
                                 self.version)
            self.tickets[number] = ticket
            self._submit(ticket)

    def _submit(self, ticket: GroupTicket) -> None:
        self.inflight += 1
        ticket.calls += 1
        self.pool.submit(self._call, ticket, self.version)

    def _call(self, ticket: GroupTicket, version: int) -> None:
        """One generation request for the group's unfinished samples, under weights `version`."""
        try:
            pending = ticket.pending
            fresh = all(not ticket.slots[i].tokens for i in pending)
            seed = self.seed * 1_000_003 + ticket.number * 7_919 + ticket.calls
            if fresh and len(pending) == len(ticket.slots):
                params = replace(self.sampling([len(ticket.prompt_ids)], len(pending), seed),
                                 max_tokens=ticket.max_tokens)
                completions = self.fleet.generate([ticket.prompt_ids], params)
                placed = list(zip(pending, completions))
            else:
                prompts = [ticket.prompt_ids + ticket.slots[i].tokens for i in pending]
                room = max(ticket.max_tokens - len(ticket.slots[i].tokens) for i in pending)
                params = replace(self.sampling([len(p) for p in prompts], 1, seed), max_tokens=room)
                completions = sorted(self.fleet.generate(prompts, params), key=lambda c: c.prompt_index)
                placed = [(pending[c.prompt_index], c) for c in completions]
            for index, completion in placed:
                self._extend(ticket, ticket.slots[index], completion, version)
            self._score_finished(ticket)
        except BaseException as err:
            with self.cond:
                self.inflight -= 1
                if not self.closing:
                    self.error = err
                self.cond.notify_all()
            return
        with self.cond:
            self.inflight -= 1
            if self.closing:
                pass
            elif ticket.pending:
                self.continuations.append(ticket)
            else:
                ticket.group = self._group(ticket)
                self.window.finish(ticket.number)
                self.last_finish = time.monotonic()
            self.cond.notify_all()

    def _extend(self, ticket: GroupTicket, slot: _Slot, completion: Completion, version: int) -> None:
        room = ticket.max_tokens - len(slot.tokens)
        tokens, logprobs = completion.token_ids[:room], completion.logprobs[:room]
        if slot.tokens and tokens:
            ticket.resumes += 1
            with self.cond:
                self.counters["partial_resumes"] += 1
        slot.tokens += tokens
        slot.logprobs += logprobs
        slot.versions += [version] * len(tokens)
        if completion.finish_reason == "abort":
            if not self.partial:
                slot.reset()     # started again from scratch (without partial rollouts only a stop aborts)
            elif len(slot.tokens) >= ticket.max_tokens:
                slot.finish_reason = "length"
            return
        slot.finish_reason = "length" if len(completion.token_ids) > room else completion.finish_reason

    def _score_finished(self, ticket: GroupTicket) -> None:
        """Score samples that just finished; a FAILED one is sampled again while attempts remain."""
        for slot in ticket.slots:
            if slot.finish_reason is None or slot.trajectory is not None:
                continue
            completion = Completion(0, slot.tokens, slot.logprobs, slot.finish_reason)
            trajectory = self.collector._score(completion, ticket.prompt, ticket.prompt_ids, ticket.max_tokens)
            trajectory.attempts = slot.attempts
            trajectory.versions = list(slot.versions)
            if trajectory.status == FAILED and slot.attempts < self.retry_limit:
                slot.reset()
                slot.attempts += 1
                continue
            if self.mask_offpolicy and slot.versions and slot.versions[0] != slot.versions[-1]:
                newest = slot.versions[-1]
                trajectory.sample.loss_mask = [int(v == newest) for v in slot.versions]
            slot.trajectory = trajectory

    def _group(self, ticket: GroupTicket) -> Group:
        group = Group(ticket.prompt, [slot.trajectory for slot in ticket.slots])  # type: ignore[misc]
        for t in group.trajectories:
            if t.status == FAILED:
                t.raw_reward = 0.0
        self.collector._transform([group])
        return group
