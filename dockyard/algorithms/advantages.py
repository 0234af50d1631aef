"""Advantage estimators: rewards of a GRPO batch -> one advantage per trajectory."""

from __future__ import annotations

import torch

NORM_MODES = ("none", "group_mean", "group_zscore", "batch_mean", "batch_zscore")


class GroupRelativeAdvantage:
    """GRPO: reward minus the group (or batch) mean, optionally divided by its standard deviation."""

    def __init__(self, norm_mode: str = "group_zscore", epsilon: float = 1e-6, **_: object):
        if norm_mode not in NORM_MODES:
            raise ValueError(f"unknown norm_mode {norm_mode!r}; one of {', '.join(NORM_MODES)}")
        self.norm_mode, self.epsilon = norm_mode, epsilon

    def __call__(self, rewards: torch.Tensor, group_sizes: list[int]) -> torch.Tensor:
        """`rewards` is flat, groups consecutive; returns advantages of the same shape."""
        rewards = rewards.double()
        if sum(group_sizes) != rewards.numel():
            raise ValueError(f"group sizes add up to {sum(group_sizes)} but there are {rewards.numel()} rewards")
        if self.norm_mode == "none" or rewards.numel() == 0:
            return rewards.float()
        if self.norm_mode.startswith("batch"):
            centred = rewards - rewards.mean()
            if self.norm_mode == "batch_zscore":
                centred = centred / (_std(rewards) + self.epsilon)
            return centred.float()
        if len(set(group_sizes)) > 1:
            raise ValueError(f"{self.norm_mode} needs equal group sizes, got {sorted(set(group_sizes))}")
        groups = rewards.view(len(group_sizes), group_sizes[0])
        centred = groups - groups.mean(dim=1, keepdim=True)
        if self.norm_mode == "group_zscore":
            centred = centred / (_std(groups, dim=1) + self.epsilon)
        return centred.reshape(-1).float()


def _std(values: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Unbiased standard deviation, 0 for a single value (no spread, so no scaling)."""
    count = values.numel() if dim is None else values.shape[dim]
    if count < 2:
        return torch.zeros(()) if dim is None else torch.zeros(values.shape[0], 1, dtype=values.dtype)
    return values.std() if dim is None else values.std(dim=dim, keepdim=True)
