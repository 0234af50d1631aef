"""The data plane: what a run whose rollouts come from rollout-worker jobs through a broker needs."""

from __future__ import annotations

from typing import Iterator

from dockyard.config.constraints.registry import rule
from dockyard.config.errors import Problem
from dockyard.config.schema import MasterConfig


@rule
def data_plane(cfg: MasterConfig) -> Iterator[Problem]:
    """data_plane: exactly one of address and start; port only with start; rollout-worker jobs of one node; async GRPO on, partial_rollout off, sliding_window no-window; no SFT; no validation (the trainer's job has no generation servers)."""
    plane = cfg.data_plane
    if plane is None:
        return
    why = "data_plane: "
    if (plane.address is None) == (not plane.start):
        yield Problem("data_plane.address", why + ("give the address of a running Redis / Valkey server, or "
                      "start: true" if plane.address is None else "address and start: true exclude each other "
                      "(start runs the broker the address would name)"))
    if plane.port and not plane.start:
        yield Problem("data_plane.port", why + "the port of the broker `start` runs; with address, the port is "
                      "part of the address")
    if cfg.cluster.rollout.num_nodes > 1:
        yield Problem("cluster.rollout.num_nodes", why + "a rollout-worker job is one node (its servers run there); "
                      "submit more workers for more nodes (dockyard-submit --rollout-workers N)")
    if cfg.sft is not None:
        yield Problem("data_plane", why + "SFT samples nothing; remove data_plane")
    a = cfg.grpo.async_grpo
    if cfg.sft is None and not a.enabled:
        yield Problem("grpo.async_grpo.enabled", why + "workers sample with the weights they last loaded, so the "
                      "plane runs the async loop (staleness bound, importance-sampling correction); set it to true")
    if a.partial_rollout:
        yield Problem("grpo.async_grpo.partial_rollout", why + "a worker finishes each request under the weights "
                      "it started with; set it to false")
    if a.sliding_window != "no-window":
        yield Problem("grpo.async_grpo.sliding_window", why + "groups train in the order workers deliver them "
                      f"(no-window); {a.sliding_window!r} needs one dispatcher that sees every running group")
    if cfg.grpo.val_period or cfg.grpo.val_at_start:
        yield Problem("grpo.val_period" if cfg.grpo.val_period else "grpo.val_at_start", why + "validation "
                      "generates on the trainer's own servers, which a data-plane run does not start; set "
                      "grpo.val_period: 0 and grpo.val_at_start: false (evaluate checkpoints apart)")
