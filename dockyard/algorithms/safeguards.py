"""Off-policy safeguards (docs/algorithms.md): they compare the policy that trains (pi_old: the trainer's
logprobs of the sampled tokens at the step's start) with the one that sampled (pi_rollout: the
engine's logprobs), per sample and per response token, before the step trains.

Each returns new per-sample masks (1 keep, 0 drop: a dropped token leaves both the numerator and the
denominator of the loss) and, for IS correction, per-token weights (no gradient) that multiply the
per-token policy loss.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dockyard.config.schema.loss import ImportanceSamplingCorrection, M2POConfig, OPSMConfig


def _log_ratios(old: list[torch.Tensor], rollout: list[torch.Tensor]) -> list[torch.Tensor]:
    return [(o.double() - r.double()).clamp(-20, 20) for o, r in zip(old, rollout)]


def importance_weights(old: list[torch.Tensor], rollout: list[torch.Tensor], masks: list[torch.Tensor],
                       cfg: ImportanceSamplingCorrection) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """w = pi_old / pi_rollout per token, per sequence (product over trained tokens) or geometric
    (exp of the mean log-ratio); out-of-bound weights are clamped (action clip) or their tokens, or
    whole sequences for sequence / geometric, dropped (action mask)."""
    weights, kept = [], []
    low = cfg.lower_bound if cfg.lower_bound is not None else 0.0
    high = cfg.upper_bound if cfg.upper_bound is not None else float("inf")
    for d, m in zip(_log_ratios(old, rollout), masks):
        m = m.double()
        if cfg.level == "token":
            w = torch.exp(d)
        else:
            total = (d * m).sum()
            if cfg.level == "geometric":
                total = total / m.sum().clamp(min=1)
            w = torch.exp(total.clamp(-20, 20)).expand_as(d).clone()
        if cfg.action == "clip":
            weights.append(w.clamp(low, high).float())
            kept.append(m.float())
        else:
            inside = ((w >= low) & (w <= high)).double()
            weights.append(w.float())
            kept.append((m * inside).float())
    return weights, kept


def m2po_masks(old: list[torch.Tensor], rollout: list[torch.Tensor], masks: list[torch.Tensor],
               threshold: float) -> list[torch.Tensor]:
    """Drop the tokens with the largest (log pi_old/pi_rollout)^2, largest first, until the mean of the
    remaining tokens' squares (the second moment) is at most `threshold`."""
    squares = [d.square() for d in _log_ratios(old, rollout)]
    flat = torch.cat([s[m.bool()] for s, m in zip(squares, masks)]) if squares else torch.zeros(0)
    if flat.numel() == 0 or float(flat.mean()) <= threshold:
        return [m.float() for m in masks]
    ordered = torch.sort(flat, descending=True).values
    # mean of ordered[k:] for every k; the first k that brings it under the threshold
    suffix_sums = torch.flip(torch.cumsum(torch.flip(ordered, [0]), 0), [0])
    counts = torch.arange(ordered.numel(), 0, -1, dtype=ordered.dtype)
    under = (suffix_sums / counts <= threshold).nonzero()
    drop = int(under[0]) if under.numel() else ordered.numel()
    cutoff = float(ordered[drop - 1]) if drop else float("inf")
    # ties at the cutoff: drop exactly `drop` tokens, largest first, in sample order
    budget, out = drop, []
    for s, m in zip(squares, masks):
        keep = m.double().clone()
        for t in torch.argsort(s, descending=True).tolist():
            if budget == 0 or s[t] < cutoff:
                break
            if keep[t] > 0:
                keep[t] = 0
                budget -= 1
        out.append(keep.float())
    return out


def opsm_masks(behaviour: list[torch.Tensor], current: list[torch.Tensor], advantages: list[float],
               masks: list[torch.Tensor], delta: float) -> list[torch.Tensor]:
    """Off-policy sequence masking: a sequence with a negative advantage whose mean per-token
    log(pi_behaviour / pi_current) over its trained tokens exceeds delta is dropped whole."""
    out = []
    for b, c, a, m in zip(behaviour, current, advantages, masks):
        m = m.double()
        kl = float(((b.double() - c.double()) * m).sum() / m.sum().clamp(min=1))
        out.append(torch.zeros_like(m).float() if a < 0 and kl > delta else m.float())
    return out


# --- registered components: built from their loss_fn section, applied in the order below ---------

ORDER = ("is_correction", "m2po", "opsm")


@dataclass
class SafeguardInputs:
    old: list[torch.Tensor]          # pi_old per response token (the trainer at the step's start)
    rollout: list[torch.Tensor]      # pi_rollout per response token (the engine that sampled)
    advantages: list[float]
    masks: list[torch.Tensor]        # 1 on tokens that train so far


class ISCorrection:
    """Importance-sampling correction pi_old / pi_rollout at token / sequence / geometric level (clip or mask)."""

    def __init__(self, config: ImportanceSamplingCorrection):
        self.config = config

    def __call__(self, inputs: SafeguardInputs) -> tuple[list[torch.Tensor], list[torch.Tensor] | None]:
        weights, masks = importance_weights(inputs.old, inputs.rollout, inputs.masks, self.config)
        return masks, weights


class M2PO:
    """M2PO: mask the largest squared log-ratio tokens until the second moment is under threshold."""

    def __init__(self, config: M2POConfig):
        self.config = config

    def __call__(self, inputs: SafeguardInputs) -> tuple[list[torch.Tensor], None]:
        return m2po_masks(inputs.old, inputs.rollout, inputs.masks, self.config.threshold), None


class OPSM:
    """OPSM: drop negative-advantage sequences whose KL to the sampler exceeds delta."""

    def __init__(self, config: OPSMConfig):
        self.config = config

    def __call__(self, inputs: SafeguardInputs) -> tuple[list[torch.Tensor], None]:
        return opsm_masks(inputs.rollout, inputs.old, inputs.advantages, inputs.masks, self.config.delta), None
