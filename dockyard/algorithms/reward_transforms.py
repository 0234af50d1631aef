"""Reward transforms: what happens to the environment's rewards before advantages are computed.

Applied on rank 0 to every trajectory of a rollout batch, in this order (each only when configured):

    scaling -> invalid_action_penalty -> overlong_shaping

Scaling maps the environment's own reward range first, so the penalties after it are in the units
that train. The reference KL in the reward (loss_fn.kl_in_reward) comes last, on the trainer ranks,
because it needs the policy's and the reference's logprobs (dockyard.algorithms.reward_transforms.
sequence_kl).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dockyard.config.schema.grpo import GRPOConfig

ORDER = ("scaling", "invalid_action_penalty", "overlong_shaping")


@dataclass
class RolloutFacts:
    """What the transforms may look at besides the reward, one entry per trajectory."""

    response_tokens: torch.Tensor   # tokens the engine generated
    max_tokens: torch.Tensor        # the response limit of the trajectory's request
    action_valid: torch.Tensor      # False when the environment could not parse the model's action


def enabled_transforms(grpo: GRPOConfig) -> list[str]:
    on = {"scaling": grpo.reward_scaling.enabled, "invalid_action_penalty": grpo.invalid_action_penalty != 0,
          "overlong_shaping": grpo.reward_shaping.enabled}
    return [name for name in ORDER if on[name]]


class RewardScaling:
    """Linear map of [source_min, source_max] onto [target_min, target_max]; rewards outside the source
    range are clamped to it first."""

    def __init__(self, config: GRPOConfig):
        self.config = config.reward_scaling

    def __call__(self, rewards: torch.Tensor, facts: RolloutFacts) -> torch.Tensor:
        c = self.config
        inside = rewards.clamp(c.source_min, c.source_max)
        return c.target_min + (inside - c.source_min) * (c.target_max - c.target_min) / (c.source_max - c.source_min)


class InvalidActionPenalty:
    """Adds grpo.invalid_action_penalty (<= 0) to a trajectory whose action the environment could not parse."""

    def __init__(self, config: GRPOConfig):
        self.penalty = config.invalid_action_penalty

    def __call__(self, rewards: torch.Tensor, facts: RolloutFacts) -> torch.Tensor:
        return rewards + self.penalty * (~facts.action_valid).to(rewards.dtype)


class OverlongShaping:
    """DAPO's soft overlong punishment: with L the request's response limit and b the buffer length,
    a response of l tokens gets -overlong_penalty x clamp((l - (L - b)) / b, 0, 1): nothing up to
    L - b tokens, then a linear ramp to the full penalty at the limit (b is capped at L)."""

    def __init__(self, config: GRPOConfig):
        self.config = config.reward_shaping

    def __call__(self, rewards: torch.Tensor, facts: RolloutFacts) -> torch.Tensor:
        limit = facts.max_tokens.to(rewards.dtype)
        buffer = limit.clamp(max=float(self.config.overlong_buffer_length))
        ramp = ((facts.response_tokens.to(rewards.dtype) - (limit - buffer)) / buffer.clamp(min=1)).clamp(0, 1)
        return rewards - self.config.overlong_penalty * ramp


def sequence_kl(old: list[torch.Tensor], ref: list[torch.Tensor], masks: list[torch.Tensor], kind: str) -> torch.Tensor:
    """KL in the reward: per trajectory, the sum over its trained response tokens of the per-token KL
    estimate between the policy that sampled it and the reference."""
    from dockyard.algorithms.losses import kl_estimate

    return torch.tensor([float((kl_estimate(o.double(), r.double(), kind) * m.double()).sum())
                         for o, r, m in zip(old, ref, masks)], dtype=torch.float64)
