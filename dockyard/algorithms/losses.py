"""Policy losses. A loss returns per-token losses; dockyard.algorithms.aggregate turns them into
one number with the configured aggregation over the whole optimizer step."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dockyard import registry
from dockyard.config.schema.loss import LossConfig


@dataclass
class LossInputs:
    logprobs: torch.Tensor        # [B, T] current policy, with grad
    old_logprobs: torch.Tensor    # [B, T] policy that sampled (or the step's start)
    advantages: torch.Tensor      # [B, T]
    mask: torch.Tensor            # [B, T] 1 on trained tokens
    ref_logprobs: torch.Tensor | None = None
    entropy: torch.Tensor | None = None  # [B, T]


def k1(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """k1: log(pi / pi_ref), unbiased, high variance, can be negative."""
    return logprobs - ref_logprobs


def k2(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """k2: (log(pi / pi_ref))^2 / 2, biased, low variance, never negative."""
    return 0.5 * (logprobs - ref_logprobs).square()


def k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """k3: pi_ref / pi - 1 - log(pi_ref / pi), unbiased, low variance, never negative."""
    log_ratio = logprobs - ref_logprobs
    # clamp keeps exp() finite on extreme ratios; the estimate is already huge there
    return torch.exp((-log_ratio).clamp(max=20)) + log_ratio - 1


def kl_estimate(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, kind: str) -> torch.Tensor:
    """Per-token estimate of KL(pi || pi_ref) from samples of pi by the registered estimator `kind`
    (Schulman's k1 / k2 / k3)."""
    return registry.get("kl_estimator", kind).factory(logprobs, ref_logprobs)


def _reference_kl_and_entropy(config: LossConfig, inputs: LossInputs, loss: torch.Tensor, ratio: torch.Tensor,
                              metrics: dict[str, torch.Tensor]) -> torch.Tensor:
    """The terms every policy loss shares: reference KL in the loss (unless it goes into the reward) and
    the entropy bonus."""
    if inputs.ref_logprobs is not None and config.reference_policy_kl_penalty > 0 and not config.kl_in_reward:
        kl = kl_estimate(inputs.logprobs, inputs.ref_logprobs, config.reference_policy_kl_type)
        if config.use_unbiased_kl:
            kl = kl * ratio
        loss = loss + config.reference_policy_kl_penalty * kl
        metrics["kl_ref"] = kl.detach()
    if inputs.entropy is not None:
        if config.entropy_coef > 0:
            loss = loss - config.entropy_coef * inputs.entropy
        metrics["entropy"] = inputs.entropy.detach()
    return loss


class ClippedPGLoss:
    """PPO-style clipped policy gradient with clip-higher, optional dual clip, reference KL and entropy."""

    def __init__(self, config: LossConfig):
        self.config = config

    def __call__(self, inputs: LossInputs) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        c = self.config
        log_ratio = (inputs.logprobs - inputs.old_logprobs).clamp(-20, 20)
        ratio = torch.exp(log_ratio)
        adv = inputs.advantages
        unclipped = -adv * ratio
        clipped = -adv * ratio.clamp(1 - c.ratio_clip_min, 1 + c.ratio_clip_max)
        loss = torch.maximum(unclipped, clipped)
        if c.ratio_clip_c is not None:
            loss = torch.where(adv < 0, torch.minimum(loss, -adv * c.ratio_clip_c), loss)
        metrics = {"clip_fraction": (clipped > unclipped).float(), "approx_kl_old": -log_ratio.detach()}
        return _reference_kl_and_entropy(c, inputs, loss, ratio, metrics), metrics


class GSPOLoss:
    """GSPO (Zheng et al. 2025): the clipped objective on one importance ratio per sequence,
    s_i = exp(mean over the sequence's trained tokens of (log pi - log pi_old)), with gradient through
    s_i; every token of a sequence carries that sequence's loss, so seq-mean-token-mean aggregation
    gives GSPO's per-sequence mean. Clip ranges are on s_i (the paper uses ~3e-4 / 4e-4)."""

    def __init__(self, config: LossConfig):
        self.config = config

    def __call__(self, inputs: LossInputs) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        c = self.config
        mask = inputs.mask.to(inputs.logprobs.dtype)
        token_log_ratio = (inputs.logprobs - inputs.old_logprobs) * mask
        seq_log_ratio = (token_log_ratio.sum(dim=1) / mask.sum(dim=1).clamp(min=1)).clamp(-20, 20)
        ratio = torch.exp(seq_log_ratio)[:, None].expand_as(inputs.logprobs)
        adv = inputs.advantages
        unclipped = -adv * ratio
        clipped = -adv * ratio.clamp(1 - c.ratio_clip_min, 1 + c.ratio_clip_max)
        loss = torch.maximum(unclipped, clipped)
        metrics = {"clip_fraction": (clipped > unclipped).float(),
                   "approx_kl_old": -(inputs.logprobs - inputs.old_logprobs).clamp(-20, 20).detach()}
        token_ratio = torch.exp((inputs.logprobs - inputs.old_logprobs).clamp(-20, 20))
        return _reference_kl_and_entropy(c, inputs, loss, token_ratio, metrics), metrics


def aggregate(per_token: torch.Tensor, mask: torch.Tensor, mode: str, total_tokens: float,
              total_sequences: float) -> torch.Tensor:
    """This micro-batch's share of the step loss. `total_*` count the whole optimizer step across
    ranks, so summing shares over micro-batches (and averaging over ranks) gives the step loss."""
    mask = mask.to(per_token.dtype)
    if mode == "token-mean":
        return (per_token * mask).sum() / max(total_tokens, 1.0)
    if mode == "seq-mean-token-mean":
        per_sequence = (per_token * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1)
        return per_sequence.sum() / max(total_sequences, 1.0)
    raise ValueError(f"unknown loss_agg_mode {mode!r}")
