"""Hung replicas: a server process that is alive but no longer answers /health ends the run, named,
instead of leaving the trainer waiting on it until a request times out (hours, for long rollouts)."""

from __future__ import annotations

import time

from dockyard.generation.generator import ServerClient

HUNG_AFTER_S = 40.0     # with probes every 5 s: a hung replica ends the run within a minute
PROBE_EVERY_S = 5.0


class HealthProbe:
    def __init__(self, clients: list[ServerClient], hung_after_s: float = HUNG_AFTER_S,
                 every_s: float = PROBE_EVERY_S):
        self.clients, self.hung_after_s, self.every_s = clients, hung_after_s, every_s
        now = time.monotonic()
        self.last_ok = [now] * len(clients)
        self._next = now

    def hung(self) -> int | None:
        """Index of a replica that has not answered /health for hung_after_s (probing at most every every_s)."""
        now = time.monotonic()
        if now < self._next:
            return None
        self._next = now + self.every_s
        for index, client in enumerate(self.clients):
            if client.healthy():
                self.last_ok[index] = time.monotonic()
            elif time.monotonic() - self.last_ok[index] > self.hung_after_s:
                return index
        return None

    def describe(self, index: int) -> str:
        return (f"{self.clients[index].name} at {self.clients[index].url} has not answered /health for "
                f"{time.monotonic() - self.last_ok[index]:.0f} s (hung)")
