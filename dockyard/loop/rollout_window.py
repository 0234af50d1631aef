"""Which prompt groups the async rollout driver may start, and which finished ones a training step
takes: the pipeline capacity and sliding-window strategies of docs/async.md, and the staleness
bound of grpo.async_grpo.

Groups are numbered in the order they start. A group is *open* from its start until a step takes
it (or it is dropped as too stale); `capacity = int(B x (1 + max_staleness_steps))` bounds the open
groups. Weights carry a version (the number of optimizer steps behind them); a group started under
version v and taken by the step that trains version w has lag w - v, which never exceeds
`ceil(max_staleness_steps)`:

- start gate: a group started now is taken no earlier than the step training version
  (taken + open) // B, so it starts only while that stays within v + lag bound;
- take: a finished group whose lag would exceed the bound is dropped (its prompt is started again
  under newer weights), and counted.

Strategies:
- `no-window`: start whenever an open slot is free; a step takes the first groups to finish.
  Most throughput; a step favours short answers, and a slow group can be overtaken until it is too
  stale and dropped.
- `window-gated`: groups start only within `capacity` start numbers of the oldest group still
  running, so a straggler holds the window until it finishes (it never falls far behind); steps
  still take the first groups to finish.
- `windowed-fifo`: the same window, and a step takes groups strictly in start order: a finished
  group waits behind an unfinished earlier one. No length bias and a reproducible order, paid for
  with head-of-line waiting.
"""

from __future__ import annotations

import math

STRATEGIES = ("no-window", "window-gated", "windowed-fifo")


def pipeline_capacity(batch: int, stale_steps: float) -> int:
    """Open groups allowed at once (int(B x (1 + stale_steps)), fractional allowed; docs/async.md)."""
    return max(batch, int(batch * (1 + stale_steps)))


class DispatchWindow:
    def __init__(self, batch: int, stale_steps: float, strategy: str):
        if strategy not in STRATEGIES:
            raise ValueError(f"unknown sliding window {strategy!r}; one of {', '.join(STRATEGIES)}")
        self.batch, self.strategy = batch, strategy
        self.capacity = pipeline_capacity(batch, stale_steps)
        self.max_lag = math.ceil(stale_steps)
        self.next_number = 0
        self.taken = 0                          # groups taken by steps so far
        self.version_of: dict[int, int] = {}    # open group -> version it started under
        self.finished: list[int] = []           # open groups that finished, in finishing order

    # --- starting ---------------------------------------------------------------------------

    def startable(self, version: int) -> int:
        """How many groups may start now under weights `version`."""
        open_count = len(self.version_of)
        room = self.capacity - open_count
        # the next group is the (taken + open)-th to be taken: by the step training version (taken+open)//B
        room = min(room, (version + self.max_lag + 1) * self.batch - (self.taken + open_count))
        if self.strategy != "no-window":
            # anchored at the oldest group still running (a finished one only waits to be taken)
            oldest = min((n for n in self.version_of if n not in self.finished), default=self.next_number)
            room = min(room, oldest + self.capacity - self.next_number)
        return max(0, room)

    def start(self, version: int) -> int:
        number = self.next_number
        self.next_number += 1
        self.version_of[number] = version
        return number

    def finish(self, number: int) -> None:
        if number not in self.version_of or number in self.finished:
            raise ValueError(f"group {number} is not running")
        self.finished.append(number)

    def forget(self, number: int) -> None:
        """A group given up without training (the run stops, or its attempt failed outright)."""
        self.version_of.pop(number, None)
        if number in self.finished:
            self.finished.remove(number)

    # --- taking -----------------------------------------------------------------------------

    def lag(self, number: int, trainer_version: int) -> int:
        return trainer_version - self.version_of[number]

    def drop_stale(self, trainer_version: int) -> list[int]:
        """Finished groups the step training `trainer_version` may not take (lag over the bound):
        given up here, to be started again by the caller."""
        dropped = [n for n in self.finished if self.lag(n, trainer_version) > self.max_lag]
        for number in dropped:
            self.forget(number)
        return dropped

    def take(self, count: int) -> list[int] | None:
        """`count` finished groups for the next step, in the strategy's order; None while there are
        not enough (call drop_stale first)."""
        if self.strategy == "windowed-fifo":
            running_first = min((n for n in self.version_of if n not in self.finished), default=None)
            ready = sorted(n for n in self.finished if running_first is None or n < running_first)
        else:
            ready = list(self.finished)
        if len(ready) < count:
            return None
        groups = ready[:count]
        for number in groups:
            self.forget(number)
        self.taken += count
        return groups

    @property
    def open_numbers(self) -> list[int]:
        return sorted(self.version_of)
