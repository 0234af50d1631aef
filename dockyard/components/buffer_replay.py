"""Buffer replay strategies: which buffered prompt groups a dynamic sampler takes first."""

from __future__ import annotations

from typing import Sequence, TypeVar

from dockyard.registry import register

T = TypeVar("T")


@register("buffer_replay_strategy", "fifo")
def fifo(buffer: Sequence[T], count: int) -> tuple[list[T], list[T]]:
    """Oldest groups first (the default when none is named)."""
    return list(buffer[:count]), list(buffer[count:])


@register("buffer_replay_strategy", "lifo")
def lifo(buffer: Sequence[T], count: int) -> tuple[list[T], list[T]]:
    """Newest groups first: favours the least stale samples."""
    taken = list(buffer[len(buffer) - count:]) if count else []
    return taken[::-1], list(buffer[: len(buffer) - len(taken)])
