"""Advantage estimators: rewards of a GRPO batch -> one advantage per trajectory."""

from __future__ import annotations

import torch

NORM_MODES = ("none", "group_mean", "group_zscore", "batch_mean", "batch_zscore")


class GroupRelativeAdvantage:
    """GRPO: reward minus the group (or batch) mean, optionally divided by its standard deviation."""

    def __init__(self, norm_mode: str = "group_zscore", epsilon: float = 1e-6):
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


class OnPolicyDistillationAdvantage:
    """OPD (stage 3 of the V4-style recipe, docs/distillation.md): the environment reward is replaced by a
    per-token advantage pg_ratio x sg[log pi_teacher - log pi_student] on the sampled tokens, the
    negative of the k1 estimate of KL(student || teacher) at each token. Token-level estimator only:
    it needs the teacher's logprob of the sampled token, not its full distribution."""

    per_token = True

    def __init__(self, norm_mode: str = "none", epsilon: float = 1e-6, pg_ratio: float = 1.0):
        if norm_mode != "none":
            raise ValueError(f"opd advantages are per-token teacher/student log-ratios; norm_mode must be none, "
                             f"got {norm_mode!r}")
        self.pg_ratio = pg_ratio

    def __call__(self, student: list[torch.Tensor], teacher: list[torch.Tensor],
                 masks: list[torch.Tensor]) -> list[torch.Tensor]:
        """Per trajectory: the advantage of each response token (0 where the mask is 0: tool output,
        environment text, masked off-policy tokens)."""
        out = []
        for index, (s, t, m) in enumerate(zip(student, teacher, masks)):
            if not (s.shape == t.shape == m.shape):
                raise ValueError(f"trajectory {index}: student {tuple(s.shape)}, teacher {tuple(t.shape)} and "
                                 f"mask {tuple(m.shape)} logprobs differ in length")
            out.append((self.pg_ratio * (t.double() - s.double()) * (m > 0)).float().detach())
        return out
