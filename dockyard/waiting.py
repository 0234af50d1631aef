"""One way to wait: poll a condition until it holds or a deadline passes, and say what was awaited."""

from __future__ import annotations

import time
from typing import Callable, TypeVar

from dockyard.errors import ComponentError

T = TypeVar("T")


class WaitTimeout(ComponentError, TimeoutError):
    pass


def wait_until(predicate: Callable[[], T], timeout_s: float, what: str, interval_s: float = 0.2) -> T:
    """The predicate's first truthy value; WaitTimeout naming `what` after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise WaitTimeout(f"waited {timeout_s:.0f} s for {what}")
        time.sleep(interval_s)
