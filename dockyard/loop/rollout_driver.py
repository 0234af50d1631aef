"""The async rollout driver, on trainer rank 0: keeps the rollout fleet busy while the trainer trains.

A thread of its own starts prompt groups within the DispatchWindow's capacity, lag and window
rules. Each group runs in a worker thread through the step collector's own `sample_groups` (the
single-turn sampler, or the multi-turn agent episodes: scoring, retries and reward transforms
included), whose engine calls go through the driver's `generate`: one request per group (per turn,
for agents), so a replica batches whatever is in flight, and every sampled token is tagged with the
weights version that sampled it. Finished groups wait in the window until a step takes them.

Refit: the trainer publishes each step's weights; the driver installs them on every replica between
requests, never under one, so a request's tokens all come from one version:
- partial_rollout false: no request starts while weights wait; the ones in flight finish with the
  weights they started with, then the new weights go in (an agent's next turn is a new request);
- partial_rollout true: requests in flight are aborted at once, the new weights go in, and each
  unfinished sample continues from its last token (prompt + tokens so far) under the new version,
  keeping what was sampled. mask_offpolicy_in_partial_rollout gives the older tokens loss mask 0.

The trainer is never held up by either: it trains on groups already finished.

Checkpoints: groups started but not yet trained are not saved; their prompts are *replayed*
(state() names their rows; after a resume they start first, under the resumed weights), so no
prompt is trained twice and none is lost.
"""

from __future__ import annotations

import contextlib
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Callable

from dockyard.config.schema import MasterConfig
from dockyard.data.datasets import Prompt, PromptLoader
from dockyard.generation.engine import Completion, SamplingParams
from dockyard.generation.generator import GenerationServerError, Generator
from dockyard.loop.rollout_window import DispatchWindow
from dockyard.loop.rollouts import Group, RolloutCollector

ABORT_RETRY_S = 0.2


class _Closing(Exception):
    """The driver is stopping: a group's worker leaves without a result."""


@dataclass
class _Sample:
    """One sample of a generate call, across its partial continuations."""
    prompt_index: int
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    finish_reason: str | None = None     # None while it still has tokens to sample


@dataclass
class GroupTicket:
    number: int                # start number (DispatchWindow)
    row: int                   # the prompt's row in the loader's dataset
    prompt: Prompt
    version: int               # weights version it started under
    group: Group | None = None


class RolloutDriver:
    def __init__(self, cfg: MasterConfig, fleet: Generator, collector: RolloutCollector, loader: PromptLoader,
                 push: Callable[[dict], None], version: int, replay: list[int] | None = None, seed: int = 0):
        a = cfg.grpo.async_grpo
        self.cfg, self.fleet, self.collector, self.loader, self.push = cfg, fleet, collector, loader, push
        self.batch = cfg.grpo.num_prompts_per_step
        self.partial, self.mask_offpolicy = a.partial_rollout, a.mask_offpolicy_in_partial_rollout
        self.window = DispatchWindow(self.batch, a.max_staleness_steps, a.sliding_window)
        self.version, self.seed = version, seed
        self.replay = list(replay or [])          # rows to start before drawing new ones
        self.tickets: dict[int, GroupTicket] = {}   # open groups
        self.taken: list[GroupTicket] = []          # taken by a step, not yet trained
        self.inflight = 0                           # generation requests in flight
        self.pending_weights: tuple[dict, int] | None = None
        self.refitting = False
        self.error: BaseException | None = None
        self.closing = False
        self.cond = threading.Condition()
        self.counters = {"regenerated_groups": 0, "partial_resumes": 0, "refits": 0, "skipped_refits": 0,
                         "refit_seconds": 0.0, "generator_idle_seconds": 0.0}
        self.last_finish = time.monotonic()
        self.last_lags: list[int] = []      # weights versions between sampling and training, per group taken
        # Multi-turn groups hold sandboxes for all their episodes: no more groups at once than the
        # environment holds episodes (env.sandbox.max_concurrent), or their episodes would wait on
        # each other's slots.
        holds = getattr(collector.env, "capacity", None) if getattr(collector, "agent", None) is not None else None
        self.group_slots = threading.BoundedSemaphore(max(1, holds // collector.group_size) if holds else
                                                      self.window.capacity)
        self.pool = ThreadPoolExecutor(max_workers=self.window.capacity, thread_name_prefix="rollout")
        self.thread = threading.Thread(target=self._drive, name="rollout-driver", daemon=True)
        collector.generate = self.generate
        collector.timer = lambda name: contextlib.nullcontext()   # phases are the trainer's; generation runs beside them

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

    def close(self, wait: bool = True) -> None:
        """Stop sampling. wait=False (a stop whose state is saved): the requests in flight are told to
        end, and nothing waits for them: the launcher's requeue must not wait behind the fleet (on a
        loaded machine that wait outlasted Slurm's KillWait, and the job was killed before it requeued)."""
        if not wait:
            with self.cond:
                self.closing = True
                self.cond.notify_all()
            try:
                self.fleet.abort()
            except GenerationServerError:
                pass
            self.pool.shutdown(wait=False, cancel_futures=True)
            return
        self.abort()
        self.thread.join(timeout=30)
        self.pool.shutdown(wait=False, cancel_futures=True)

    # --- the collectors' engine call (worker threads) ----------------------------------------

    def generate(self, prompts: list[list[int]], params: SamplingParams, images=None) -> list[Completion]:
        """The fleet's generate, between refits: each request runs under one weights version; with
        partial rollouts a sample aborted by a refit continues under the new weights, keeping its
        tokens. Every completion carries its tokens' versions."""
        samples = [_Sample(i) for i in range(len(prompts)) for _ in range(params.n)]
        calls = 0
        while pending := [s for s in samples if s.finish_reason is None]:
            version = self._begin_request()
            try:
                if calls == 0:
                    got = self.fleet.generate(prompts, params, images)
                    by_prompt: dict[int, list[_Sample]] = {}
                    for sample in samples:
                        by_prompt.setdefault(sample.prompt_index, []).append(sample)
                    placed = [(by_prompt[c.prompt_index].pop(0), c) for c in got]
                else:
                    room = max(params.max_tokens - len(s.tokens) for s in pending)
                    seed = None if params.seed is None else params.seed + 104_723 * calls
                    got = self.fleet.generate([prompts[s.prompt_index] + s.tokens for s in pending],
                                              replace(params, n=1, max_tokens=room, seed=seed),
                                              None if images is None else [images[s.prompt_index] for s in pending])
                    placed = [(pending[c.prompt_index], c) for c in got]
            finally:
                self._end_request()
            calls += 1
            for sample, completion in placed:
                self._extend(sample, completion, version, params.max_tokens)
        return [Completion(s.prompt_index, s.tokens, s.logprobs, s.finish_reason, s.versions)  # type: ignore[arg-type]
                for s in samples]

    def _extend(self, sample: _Sample, completion: Completion, version: int, max_tokens: int) -> None:
        room = max_tokens - len(sample.tokens)
        tokens = completion.token_ids[:room]
        if sample.tokens and tokens:
            with self.cond:
                self.counters["partial_resumes"] += 1
        sample.tokens += tokens
        sample.logprobs += completion.logprobs[:room]
        sample.versions += [version] * len(tokens)
        if completion.finish_reason == "abort":
            if self.closing:
                raise _Closing()
            if len(sample.tokens) >= max_tokens:
                sample.finish_reason = "length"
            elif not self.partial:
                # only a stop aborts without partial rollouts; start the sample again should one get here
                sample.tokens, sample.logprobs, sample.versions = [], [], []
            return
        sample.finish_reason = "length" if len(completion.token_ids) > room else completion.finish_reason

    def _begin_request(self) -> int:
        """Wait while new weights wait to be installed (no request may straddle a refit); the
        version the request runs under."""
        with self.cond:
            while (self.pending_weights is not None or self.refitting) and not self.closing:
                self.cond.wait(0.5)
            if self.closing:
                raise _Closing()
            self.inflight += 1
            return self.version

    def _end_request(self) -> None:
        with self.cond:
            self.inflight -= 1
            self.cond.notify_all()

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
                    if self.pending_weights is None:
                        self._start_groups()
                        idle_since = time.monotonic() if self.inflight == 0 else None
                        self.cond.wait(0.5)
                        if idle_since is not None:
                            self.counters["generator_idle_seconds"] += time.monotonic() - idle_since
                        continue
                    (weights, version), self.pending_weights = self.pending_weights, None
                    self.refitting = True
                try:
                    self._refit(weights, version)
                finally:
                    with self.cond:
                        self.refitting = False
                        self.cond.notify_all()
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
        """(cond held) the groups the window admits now."""
        for _ in range(self.window.startable(self.version)):
            row = self.replay.pop(0) if self.replay else self.loader.take_rows(1)[0]
            ticket = GroupTicket(self.window.start(self.version), row, self.loader.prompts[row], self.version)
            self.tickets[ticket.number] = ticket
            self.pool.submit(self._run_group, ticket)

    def _run_group(self, ticket: GroupTicket) -> None:
        try:
            with self.group_slots:
                seed = self.seed * 1_000_003 + ticket.number * 7_919
                (group,) = self.collector.sample_groups([ticket.prompt], seed)
            if self.mask_offpolicy:
                for t in group.trajectories:
                    _mask_older_versions(t)
        except _Closing:
            return
        except BaseException as err:
            with self.cond:
                if not self.closing:
                    self.error = err
                self.cond.notify_all()
            return
        with self.cond:
            if not self.closing:
                ticket.group = group
                self.window.finish(ticket.number)
                self.last_finish = time.monotonic()
            self.cond.notify_all()


def _mask_older_versions(trajectory) -> None:
    """Loss mask 0 on sampled tokens of versions older than the trajectory's newest (a partial
    rollout's tokens from before its last refit)."""
    versions = trajectory.versions or []
    sampled = [v for v in versions if v >= 0]
    if not sampled or min(sampled) == max(sampled):
        return
    newest = max(sampled)
    mask = trajectory.sample.loss_mask or [1] * len(versions)
    trajectory.sample.loss_mask = [m if v < 0 or v == newest else 0 for m, v in zip(mask, versions)]
