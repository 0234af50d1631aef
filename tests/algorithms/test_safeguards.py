"""Off-policy safeguards and GSPO against straightforward references written here (values and
gradients), plus the edge cases: empty masks, single tokens, extreme log-ratios."""

import math
import random

import pytest
import torch

from dockyard import registry
from dockyard.algorithms.losses import LossInputs, aggregate
from dockyard.algorithms.safeguards import importance_weights, m2po_masks, opsm_masks
from dockyard.config.schema.loss import ImportanceSamplingCorrection, LossConfig


def ragged(seed, lengths, scale=0.3):
    g = torch.Generator().manual_seed(seed)
    old = [torch.randn(n, generator=g, dtype=torch.float64) * 0.5 - 1 for n in lengths]
    rollout = [o + torch.randn(n, generator=g, dtype=torch.float64) * scale for o, n in zip(old, lengths)]
    masks = [torch.tensor([1.0 if random.Random(seed + i * 7 + t).random() > 0.2 else 0.0 for t in range(n)])
             for i, n in enumerate(lengths)]
    return old, rollout, masks


def reference_weights(old, rollout, mask, level, action, low, high):
    d = [o - r for o, r in zip(old, rollout)]
    if level == "token":
        w = [math.exp(x) for x in d]
    else:
        total = sum(x for x, m in zip(d, mask) if m)
        if level == "geometric":
            total /= max(sum(mask), 1)
        w = [math.exp(total)] * len(d)
    if action == "clip":
        return [min(max(x, low), high) for x in w], list(mask)
    return w, [m if low <= x <= high else 0.0 for x, m in zip(w, mask)]


@pytest.mark.parametrize("level", ["token", "sequence", "geometric"])
@pytest.mark.parametrize("action", ["clip", "mask"])
def test_importance_weights_match_reference(level, action):
    old, rollout, masks = ragged(3, [5, 1, 7, 4])
    low, high = (0.5, 2.0) if level == "token" else (0.9, 1.1)
    cfg = ImportanceSamplingCorrection(enabled=True, level=level, action=action, lower_bound=low, upper_bound=high)
    weights, kept = importance_weights(old, rollout, masks, cfg)
    for o, r, m, w, k in zip(old, rollout, masks, weights, kept):
        ref_w, ref_k = reference_weights(o.tolist(), r.tolist(), m.tolist(), level, action, low, high)
        trained = [i for i, v in enumerate(m.tolist()) if v]
        assert [round(float(w[i]), 5) for i in trained] == [round(x, 5) for i, x in enumerate(ref_w) if i in trained]
        assert k.tolist() == ref_k


def reference_m2po(old, rollout, masks, threshold):
    """Drop the largest squared log-ratio, one token at a time, until the mean is under threshold."""
    tokens = [((o - r) ** 2, i, t) for i, (os_, rs, ms) in enumerate(zip(old, rollout, masks))
              for t, (o, r, m) in enumerate(zip(os_, rs, ms)) if m]
    tokens.sort(key=lambda x: -x[0])
    keep = [list(m) for m in masks]
    while tokens and sum(x[0] for x in tokens) / len(tokens) > threshold:
        _, i, t = tokens.pop(0)
        keep[i][t] = 0.0
    return keep


@pytest.mark.parametrize("threshold", [0.0001, 0.02, 0.04, 10.0])
def test_m2po_matches_the_one_token_at_a_time_reference(threshold):
    old, rollout, masks = ragged(5, [6, 3, 8, 1], scale=0.4)
    got = m2po_masks(old, rollout, masks, threshold)
    expected = reference_m2po([o.tolist() for o in old], [r.tolist() for r in rollout],
                              [m.tolist() for m in masks], threshold)
    assert [g.tolist() for g in got] == expected
    kept = [((o - r) ** 2)[g.bool()] for o, r, g in zip(old, rollout, got)]
    flat = torch.cat(kept)
    assert flat.numel() == 0 or float(flat.mean()) <= threshold + 1e-12


def test_opsm_drops_only_negative_advantage_sequences_beyond_delta():
    behaviour = [torch.tensor([-1.0, -1.0]), torch.tensor([-1.0, -1.0]), torch.tensor([-0.2, -0.2]),
                 torch.tensor([-1.0])]
    current = [torch.tensor([-1.5, -1.5]), torch.tensor([-1.5, -1.5]), torch.tensor([-0.25, -0.25]),
               torch.tensor([-1.0])]
    masks = [torch.ones(2), torch.ones(2), torch.ones(2), torch.ones(1)]
    got = opsm_masks(behaviour, current, [-1.0, 1.0, -1.0, -1.0], masks, delta=0.1)
    # KLs 0.5, 0.5, 0.05, 0: only the first has A < 0 and KL > delta
    assert [g.tolist() for g in got] == [[0.0, 0.0], [1.0, 1.0], [1.0, 1.0], [1.0]]


def test_safeguards_on_empty_masks_and_extreme_ratios_stay_finite():
    old = [torch.tensor([1e4, -1e4, 0.0]), torch.tensor([0.0])]
    rollout = [torch.tensor([-1e4, 1e4, 0.0]), torch.tensor([0.0])]
    masks = [torch.ones(3), torch.zeros(1)]
    for level in ("token", "sequence", "geometric"):
        weights, kept = importance_weights(old, rollout, masks, ImportanceSamplingCorrection(
            enabled=True, level=level, action="clip", lower_bound=0.5, upper_bound=2.0))
        assert all(torch.isfinite(w).all() for w in weights) and all(float(w.max()) <= 2.0 for w in weights)
    kept = m2po_masks(old, rollout, masks, 0.04)
    assert kept[0].tolist() == [0.0, 0.0, 1.0] and kept[1].tolist() == [0.0]
    assert m2po_masks([], [], [], 0.04) == []
    far = [torch.tensor([1e4, 1e4, 0.0]), torch.tensor([0.0])]
    near = [torch.tensor([-1e4, -1e4, 0.0]), torch.tensor([0.0])]
    assert [m.tolist() for m in opsm_masks(far, near, [-1.0, -1.0], masks, 0.1)] == [[0.0, 0.0, 0.0], [0.0]]
    assert [m.tolist() for m in opsm_masks(far, near, [1.0, 1.0], masks, 0.1)] == [[1.0, 1.0, 1.0], [0.0]]


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
def test_gspo_value_and_gradient_match_a_per_sequence_reference(agg):
    cfg = LossConfig(name="gspo", ratio_clip_min=0.05, ratio_clip_max=0.08, loss_agg_mode=agg)
    torch.manual_seed(2)
    batch, width = 4, 5
    lp = (torch.randn(batch, width) * 0.3 - 1).double().requires_grad_()
    old = lp.detach() + torch.randn(batch, width).double() * 0.1
    adv = torch.tensor([[1.0], [-1.0], [0.5], [-2.0]]).double().expand(batch, width)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [0, 1, 1, 0, 0], [0, 0, 0, 0, 1]], dtype=torch.float64)
    per_token, metrics = registry.build("loss", "gspo", config=cfg)(LossInputs(lp, old, adv, mask))
    got = aggregate(per_token, mask, agg, float(mask.sum()), float(batch))
    got.backward()

    ref_lp = lp.detach().clone().requires_grad_()
    seq_losses, token_count = [], 0
    for b in range(batch):
        tokens = [t for t in range(width) if mask[b, t]]
        s = torch.exp(sum(ref_lp[b, t] - old[b, t] for t in tokens) / len(tokens))
        a = adv[b, 0]
        loss = torch.maximum(-a * s, -a * torch.clamp(s, 1 - cfg.ratio_clip_min, 1 + cfg.ratio_clip_max))
        seq_losses.append((loss, len(tokens)))
        token_count += len(tokens)
    if agg == "token-mean":
        expected = sum(loss * n for loss, n in seq_losses) / token_count
    else:
        expected = sum(loss for loss, _ in seq_losses) / batch
    expected.backward()
    assert torch.allclose(got, expected.detach())
    assert torch.allclose(lp.grad, ref_lp.grad)


def test_gspo_stays_finite_on_empty_and_extreme_sequences():
    loss_fn = registry.build("loss", "gspo", config=LossConfig(name="gspo"))
    lp = torch.tensor([[-1e4, 0.0], [60.0, -60.0], [0.0, -1.0]], requires_grad=True)
    old = torch.tensor([[0.0, 0.0], [-60.0, 60.0], [0.0, -1.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 1.0], [0.0, 0.0]])
    per_token, _ = loss_fn(LossInputs(lp, old, torch.tensor([[1.0, 1.0], [-1.0, -1.0], [1.0, 1.0]]), mask))
    aggregate(per_token, mask, "seq-mean-token-mean", 4.0, 3.0).backward()
    assert torch.isfinite(per_token).all() and torch.isfinite(lp.grad).all()
