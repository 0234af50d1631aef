"""Several generation replicas behind the one Generator interface.

A request's prompts are groups (each prompt with its params.n samples); a group never leaves the
replica it is given to. Groups go to the replica with the least outstanding work first (sample
tokens in flight from this fleet, then fewest groups given in this call), each replica gets one
batched request, and the replicas run at the same time. Control calls reach every replica.
"""

from __future__ import annotations

import threading
import time
from dataclasses import replace

from dockyard.generation.engine import Completion, SamplingParams
from dockyard.generation.generator import Generator
from dockyard.generation.images import ImageSource
from dockyard.generation.weight_transfer import call_all


class GeneratorFleet(Generator):
    def __init__(self, replicas: list[Generator], name: str = "rollout fleet"):
        if not replicas:
            raise ValueError("a fleet needs at least one replica")
        self.replicas, self.name = list(replicas), name
        self.outstanding = [0] * len(self.replicas)   # sample tokens in flight, per replica
        self._lock = threading.Lock()
        self.last_usage: dict = {}
        self.last_assignment: list[int] = []          # replica index of each prompt of the last call
        self.groups_served = [0] * len(self.replicas)  # prompt groups each replica has generated
        self._request_seconds: list[list[float]] = [[] for _ in self.replicas]   # since take_request_seconds

    def take_request_seconds(self) -> dict[str, list[float]]:
        """Each replica's generate calls' wall seconds since the last take: the per-worker generation
        timeline of a step (`gen/request_seconds/replica<i>`; loggers.py merges them for scalar-only trackers)."""
        with self._lock:
            taken, self._request_seconds = self._request_seconds, [[] for _ in self.replicas]
        return {f"gen/request_seconds/replica{index}": seconds for index, seconds in enumerate(taken)}

    def _timed(self, replica: int, call):
        started = time.monotonic()
        try:
            return call()
        finally:
            with self._lock:
                self._request_seconds[replica].append(time.monotonic() - started)

    def _assign(self, groups: int, work: int) -> list[int]:
        """Replica index per group, least outstanding work first; reserves the work."""
        given = [0] * len(self.replicas)
        choice = []
        with self._lock:
            for _ in range(groups):
                best = min(range(len(self.replicas)), key=lambda r: (self.outstanding[r], given[r], r))
                self.outstanding[best] += work
                given[best] += 1
                choice.append(best)
        return choice

    def _release(self, replica: int, work: int) -> None:
        with self._lock:
            self.outstanding[replica] -= work

    def generate(self, prompts: list[list[int]], params: SamplingParams,
                 images: list[list[ImageSource]] | None = None) -> list[Completion]:
        if len(self.replicas) == 1:
            out = self._timed(0, lambda: self.replicas[0].generate(prompts, params, images))
            self.last_usage, self.last_assignment = dict(self.replicas[0].last_usage), [0] * len(prompts)
            self.groups_served[0] += len(prompts)
            return out
        work = params.n * params.max_tokens
        assignment = self._assign(len(prompts), work)
        self.last_assignment = assignment
        for replica in assignment:
            self.groups_served[replica] += 1
        chunks = {r: [i for i, a in enumerate(assignment) if a == r] for r in sorted(set(assignment))}
        results: dict[int, list[Completion]] = {}
        usage: dict[int, dict] = {}

        def run(replica: int, indices: list[int]) -> None:
            try:
                # a seed per chunk, so two replicas never draw the same random stream
                seed = None if params.seed is None else params.seed + 7919 * indices[0]
                got = self._timed(replica, lambda: self.replicas[replica].generate(
                    [prompts[i] for i in indices], replace(params, seed=seed),
                    None if images is None else [images[i] for i in indices]))
                results[replica] = [replace(c, prompt_index=indices[c.prompt_index]) for c in got]
                usage[replica] = dict(self.replicas[replica].last_usage)
            finally:
                self._release(replica, work * len(indices))

        call_all([_Bound(self.replicas[r], run, r, idx) for r, idx in chunks.items()], "call", timeout_s=None)
        ordered = sorted((c for got in results.values() for c in got), key=lambda c: c.prompt_index)
        self.last_usage = {
            "completion_tokens": sum(u.get("completion_tokens", 0) for u in usage.values()),
            # replicas decode at the same time: the engine time of the call is the longest one
            "generation_seconds": max((u.get("generation_seconds", 0.0) for u in usage.values()), default=0.0)}
        return ordered

    def score(self, sequences: list[list[int]], starts: list[int]) -> list[list[float]]:
        if len(self.replicas) == 1:
            return self.replicas[0].score(sequences, starts)
        assignment = self._assign(len(sequences), 0)
        out: list[list[float] | None] = [None] * len(sequences)

        def run(replica: int, indices: list[int]) -> None:
            got = self.replicas[replica].score([sequences[i] for i in indices], [starts[i] for i in indices])
            for i, scores in zip(indices, got):
                out[i] = scores

        chunks = {r: [i for i, a in enumerate(assignment) if a == r] for r in sorted(set(assignment))}
        call_all([_Bound(self.replicas[r], run, r, idx) for r, idx in chunks.items()], "call", timeout_s=None)
        return out  # type: ignore[return-value]

    def pause(self) -> None:
        call_all(self.replicas, "pause")

    def resume(self) -> None:
        call_all(self.replicas, "resume")

    def abort(self) -> None:
        call_all(self.replicas, "abort")

    def healthy(self) -> bool:
        return all(replica.healthy() for replica in self.replicas)

    def unhealthy(self) -> list[Generator]:
        return [replica for replica in self.replicas if not replica.healthy()]

    def load_weights_from_disk(self, folder) -> None:
        call_all(self.replicas, "load_weights_from_disk", folder)

    def join_weight_group(self, *args) -> None:
        raise NotImplementedError("a fleet joins weight groups replica by replica (weight_transfer.FleetRefit)")

    def receive_weights(self, *args) -> None:
        raise NotImplementedError("a fleet receives weights replica by replica (weight_transfer.FleetRefit)")

    def close(self) -> None:
        for replica in self.replicas:
            replica.close()


class _Bound:
    """One replica's share of a fleet call, shaped for call_all (its errors name the replica)."""

    def __init__(self, replica: Generator, fn, *args):
        self.name, self._fn, self._args = replica.name, fn, args

    def call(self):
        return self._fn(*self._args)
