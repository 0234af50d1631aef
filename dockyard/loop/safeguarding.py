"""Applies the configured off-policy safeguards to a rank's samples before they train: the loss
masks and IS weights land on each Sample, which the policy backend honours."""

from __future__ import annotations

import torch

from dockyard.algorithms.safeguards import importance_weights, m2po_masks, opsm_masks
from dockyard.config.schema.loss import LossConfig
from dockyard.policy.dtensor import Sample


def apply_safeguards(cfg: LossConfig, samples: list[Sample], old: list[torch.Tensor]) -> dict[str, float]:
    if not samples:
        return {}
    rollout = [torch.tensor(s.rollout_logprobs, dtype=torch.float64) for s in samples]
    masks = [s.response_mask() for s in samples]
    trained = float(sum(m.sum() for m in masks))
    metrics: dict[str, float] = {}
    if cfg.is_correction.enabled:
        weights, masks = importance_weights(old, rollout, masks, cfg.is_correction)
        for sample, w in zip(samples, weights):
            sample.is_weights = w.tolist()
        clipped = sum(float(((w - torch.exp((o.double() - r).clamp(-20, 20))).abs() > 1e-9).sum())
                      for w, o, r in zip(weights, old, rollout))
        metrics["safeguard/is_weight_mean"] = float(torch.cat(weights).mean())
        metrics["safeguard/is_clipped_fraction"] = clipped / max(trained, 1.0) \
            if cfg.is_correction.action == "clip" else 0.0
    if cfg.m2po.enabled:
        masks = m2po_masks(old, rollout, masks, cfg.m2po.threshold)
    if cfg.opsm.enabled:
        masks = opsm_masks(rollout, old, [s.advantage for s in samples], masks, cfg.opsm.delta)
    for sample, mask in zip(samples, masks):
        sample.loss_mask = [int(v) for v in mask.tolist()]
    kept = float(sum(m.sum() for m in masks))
    metrics["safeguard/dropped_token_fraction"] = 1.0 - kept / max(trained, 1.0)
    return metrics
