"""Applies the configured off-policy safeguards (the rules themselves: algorithms/safeguards.py) to a
rank's samples before they train: the loss masks and IS weights land on each Sample, which the policy
backend honours."""

from __future__ import annotations

import torch

from dockyard import registry
from dockyard.algorithms.safeguards import ORDER, SafeguardInputs
from dockyard.config.schema.loss import LossConfig
from dockyard.policy.samples import Sample


def enabled_safeguards(cfg: LossConfig) -> list[str]:
    return [name for name in ORDER if getattr(cfg, name).enabled]


def apply_safeguards(cfg: LossConfig, samples: list[Sample], old: list[torch.Tensor]) -> dict[str, float]:
    names = enabled_safeguards(cfg)
    if not samples or not names:
        return {}
    rollout = [torch.tensor(s.rollout_logprobs, dtype=torch.float64) for s in samples]
    masks = [s.response_mask() for s in samples]
    trained = float(sum(m.sum() for m in masks))
    metrics: dict[str, float] = {}
    for name in names:
        section = getattr(cfg, name)
        masks, weights = registry.build("safeguard", name, config=section)(
            SafeguardInputs(old, rollout, [s.advantage for s in samples], masks))
        if weights is None:
            continue
        for sample, w in zip(samples, weights):
            sample.is_weights = w.tolist()
        # tokens whose weight the clip set to a bound (per token, or every token of a clipped sequence)
        low = section.lower_bound if section.lower_bound is not None else 0.0
        high = section.upper_bound if section.upper_bound is not None else float("inf")
        clipped = sum(float((((w <= low * (1 + 1e-6)) | (w >= high * (1 - 1e-6))).float() * m).sum())
                      for w, m in zip(weights, masks))
        metrics["safeguard/is_weight_mean"] = float(torch.cat(weights).mean())
        metrics["safeguard/is_clipped_fraction"] = clipped / max(trained, 1.0) if section.action == "clip" else 0.0
    for sample, mask in zip(samples, masks):
        sample.loss_mask = [int(v) for v in mask.tolist()]
    kept = float(sum(m.sum() for m in masks))
    metrics["safeguard/dropped_token_fraction"] = 1.0 - kept / max(trained, 1.0)
    return metrics
