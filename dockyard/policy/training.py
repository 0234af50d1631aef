"""The part of a training step every torch backend shares: a micro-batch's loss from its logprobs,
laid out as right-aligned [B, R] rows (R = the longest response), and the figures it reports."""

from __future__ import annotations

import torch

from dockyard.algorithms.losses import LossInputs, aggregate
from dockyard.policy.samples import Sample


def micro_batch_loss(samples: list[Sample], batch: list[int], logprobs: torch.Tensor, entropy: torch.Tensor,
                     masks: list[torch.Tensor], old_logprobs, ref_logprobs, loss_fn, loss_cfg,
                     totals: tuple[float, float], before_loss, sums: dict[str, float]) -> torch.Tensor:
    """This micro-batch's share of the mini-batch loss (rows `batch` of `samples`; an empty batch is a
    padding pass whose loss is zero); the loss's metrics summed over trained tokens into `sums`."""
    device = logprobs.device
    if loss_cfg.entropy_coef == 0:
        entropy = entropy.detach()
    width = logprobs.shape[1]
    mask = right_aligned([masks[i] for i in batch], width) if batch else torch.zeros_like(logprobs)
    if old_logprobs is None or not batch:
        old = logprobs.detach()
    else:
        old = right_aligned([old_logprobs[i] for i in batch], width).to(device)
    if before_loss is not None and batch:
        before_loss([samples[i] for i in batch],
                    [old[row, width - samples[i].response_length:].cpu() for row, i in enumerate(batch)])
    adv = advantages([samples[i] for i in batch], logprobs.shape)
    ref = right_aligned([ref_logprobs[i] for i in batch], width) if (batch and ref_logprobs) else None
    mask, adv = mask.to(device), adv.to(device)
    per_token, metrics = loss_fn(LossInputs(logprobs, old, adv, mask, ref.to(device) if ref is not None else None,
                                            entropy))
    if batch and any(samples[i].is_weights is not None for i in batch):
        weights = right_aligned([torch.tensor(samples[i].is_weights if samples[i].is_weights is not None
                                              else [1.0] * samples[i].response_length) for i in batch], width)
        per_token = per_token * weights.to(device, per_token.dtype)
    for name, values in metrics.items():
        sums[name] = sums.get(name, 0.0) + float((values * mask).sum())
    return aggregate(per_token, mask, loss_cfg.loss_agg_mode, *totals)


def advantages(samples: list[Sample], shape: torch.Size) -> torch.Tensor:
    """[B, width] advantages laid out as the logprob rows: per token where a sample has them."""
    if not samples:
        return torch.zeros(shape)
    if all(s.token_advantages is None for s in samples):
        return torch.tensor([s.advantage for s in samples])[:, None].expand(shape)
    return right_aligned([torch.tensor(s.token_advantages) if s.token_advantages is not None
                          else torch.full((s.response_length,), s.advantage) for s in samples], shape[1])


def right_aligned(rows: list[torch.Tensor], width: int) -> torch.Tensor:
    """Per-sample response rows as [B, width], each ending at the last column."""
    out = torch.zeros((len(rows), width))
    for index, row in enumerate(rows):
        if row.shape[0]:
            out[index, width - row.shape[0]:] = row
    return out
