"""Group filters: decide, per prompt group, whether it trains. Applied on rank 0 after rewards are
final (transforms applied), in this order: status, identical_reward. A dropped group leaves the step;
with grpo.sampler.dynamic_sampling the sampler refills the step with new groups."""

from __future__ import annotations

from typing import Protocol, Sequence

from dockyard.config.schema.grpo import GRPOConfig

ORDER = ("status", "identical_reward")

FAILED = "failed"


class Scored(Protocol):
    reward: float
    status: str


def enabled_filters(grpo: GRPOConfig) -> list[str]:
    return [name for name in ORDER if getattr(grpo.filters, name)]


class StatusFilter:
    """Drop a group if any of its trajectories FAILED (every attempt up to grpo.retry_limit failed)."""

    def __init__(self, config: GRPOConfig):
        pass

    def __call__(self, group: Sequence[Scored]) -> bool:
        return all(t.status != FAILED for t in group)


class IdenticalRewardFilter:
    """Drop a group whose trajectories all have the same reward: its advantages are all zero, so it adds
    no gradient, only tokens to the token-mean (which shrinks the step)."""

    def __init__(self, config: GRPOConfig):
        pass

    def __call__(self, group: Sequence[Scored]) -> bool:
        return len({t.reward for t in group}) > 1
