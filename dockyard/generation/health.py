"""Hung replicas: a server process that is alive but no longer answers /health ends the run, named,
instead of leaving the trainer waiting on it until a request times out (hours, for long rollouts).
A server that is still starting is given start_timeout_s to answer for the first time."""

from __future__ import annotations

import time

from dockyard.generation.generator import ServerClient

HUNG_AFTER_S = 40.0     # with probes every 5 s: a hung replica ends the run within a minute
PROBE_EVERY_S = 5.0


class HealthProbe:
    def __init__(self, clients: list[ServerClient], hung_after_s: float = HUNG_AFTER_S,
                 every_s: float = PROBE_EVERY_S, start_timeout_s: float | None = None):
        """start_timeout_s None: the servers answered /health already; else they are starting now and
        must answer within it (a first probe comes at once, then every every_s until they do)."""
        self.clients, self.hung_after_s, self.every_s = clients, hung_after_s, every_s
        self.start_timeout_s = start_timeout_s
        now = time.monotonic()
        self.started = now
        self.last_ok = [now] * len(clients)
        self.ready = [start_timeout_s is None] * len(clients)
        self._next = now

    def hung(self) -> int | None:
        """Index of a replica that has not answered /health for hung_after_s, or not within start_timeout_s
        of its start (probing at most every every_s, or 0.5 s while one is starting)."""
        now = time.monotonic()
        if now < self._next:
            return None
        # while a server starts, every 0.5 s: `ready` then says soon after its first answer whether the
        # trainer can have begun (dockyard run kills ranks that cannot have trained anything at once)
        self._next = now + (self.every_s if all(self.ready) else min(self.every_s, 0.5))
        for index, client in enumerate(self.clients):
            if client.healthy():
                self.last_ok[index], self.ready[index] = time.monotonic(), True
            elif not self.ready[index]:
                if time.monotonic() - self.started > self.start_timeout_s:
                    return index
            elif time.monotonic() - self.last_ok[index] > self.hung_after_s:
                return index
        return None

    def describe(self, index: int) -> str:
        client = self.clients[index]
        if not self.ready[index]:
            return f"{client.name} at {client.url} did not answer /health within {self.start_timeout_s:.0f} s of its start"
        return (f"{client.name} at {client.url} has not answered /health for "
                f"{time.monotonic() - self.last_ok[index]:.0f} s (hung)")


def wait_until_healthy(clients: list[ServerClient], timeout_s: float) -> None:
    """Every client's server answers /health within timeout_s, or GenerationServerError names the first
    that did not (the trainer's wait for servers started beside it)."""
    deadline = time.monotonic() + timeout_s
    for client in clients:
        client.wait_healthy(max(1.0, deadline - time.monotonic()))
