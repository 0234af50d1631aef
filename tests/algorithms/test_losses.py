"""The clipped policy-gradient loss against a per-token plain-Python reference (values and gradients)."""

import math

import pytest
import torch

from dockyard import registry
from dockyard.algorithms.losses import LossInputs, aggregate, kl_estimate
from dockyard.config.schema.loss import LossConfig


def reference_token_loss(lp, old, adv, cfg: LossConfig, ref=None):
    ratio = math.exp(lp - old)
    unclipped = -adv * ratio
    clipped = -adv * min(max(ratio, 1 - cfg.ratio_clip_min), 1 + cfg.ratio_clip_max)
    loss = max(unclipped, clipped)
    if cfg.ratio_clip_c is not None and adv < 0:
        loss = min(loss, -adv * cfg.ratio_clip_c)
    if ref is not None and cfg.reference_policy_kl_penalty > 0:
        d = lp - ref
        kl = {"k1": d, "k2": 0.5 * d * d, "k3": math.exp(-d) + d - 1}[cfg.reference_policy_kl_type]
        if cfg.use_unbiased_kl:
            kl *= ratio
        loss += cfg.reference_policy_kl_penalty * kl
    return loss


def reference_aggregate(per_token, mask, mode):
    if mode == "token-mean":
        total = sum(sum(row) for row in mask)
        return sum(l * m for lr, mr in zip(per_token, mask) for l, m in zip(lr, mr)) / total
    per_seq = [sum(l * m for l, m in zip(lr, mr)) / max(sum(mr), 1) for lr, mr in zip(per_token, mask)]
    return sum(per_seq) / len(per_seq)


CONFIGS = [
    {},
    {"ratio_clip_min": 0.1, "ratio_clip_max": 0.3},
    {"ratio_clip_c": 3.0},
    {"reference_policy_kl_penalty": 0.1, "reference_policy_kl_type": "k1"},
    {"reference_policy_kl_penalty": 0.1, "reference_policy_kl_type": "k2"},
    {"reference_policy_kl_penalty": 0.1, "reference_policy_kl_type": "k3", "use_unbiased_kl": True},
    {"loss_agg_mode": "seq-mean-token-mean"},
]


@pytest.mark.parametrize("overrides", CONFIGS, ids=[str(c) for c in CONFIGS])
def test_loss_value_and_gradient_match_reference(overrides):
    cfg = LossConfig(**overrides)
    torch.manual_seed(1)
    batch, width = 3, 5
    lp = (torch.randn(batch, width) * 0.5 - 1).double().requires_grad_()
    old = lp.detach() + torch.randn(batch, width).double() * 0.4
    ref = lp.detach() + torch.randn(batch, width).double() * 0.3
    adv = torch.randn(batch, 1).double().expand(batch, width)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [0, 1, 1, 0, 0]], dtype=torch.float64)

    per_token, _ = registry.build("loss", "clipped_pg", config=cfg)(LossInputs(lp, old, adv, mask, ref))
    got = aggregate(per_token, mask, cfg.loss_agg_mode, float(mask.sum()), float(batch))
    got.backward()

    ref_lp = lp.detach().clone().requires_grad_()
    expected_rows = []
    for b in range(batch):
        row = []
        for t in range(width):
            # the reference recomputes each token with autograd through plain scalar arithmetic
            x = ref_lp[b, t]
            ratio = torch.exp(x - old[b, t])
            a = adv[b, t]
            unclipped = -a * ratio
            clipped = -a * torch.clamp(ratio, 1 - cfg.ratio_clip_min, 1 + cfg.ratio_clip_max)
            loss = torch.maximum(unclipped, clipped)
            if cfg.ratio_clip_c is not None and a < 0:
                loss = torch.minimum(loss, -a * cfg.ratio_clip_c)
            if cfg.reference_policy_kl_penalty > 0:
                d = x - ref[b, t]
                kl = {"k1": d, "k2": 0.5 * d * d, "k3": torch.exp(-d) + d - 1}[cfg.reference_policy_kl_type]
                loss = loss + cfg.reference_policy_kl_penalty * (kl * ratio if cfg.use_unbiased_kl else kl)
            assert abs(float(loss.detach()) - reference_token_loss(float(x), float(old[b, t]), float(a), cfg,
                                                          float(ref[b, t]))) < 1e-9
            row.append(loss)
        expected_rows.append(row)
    expected = reference_aggregate(expected_rows, mask.tolist(), cfg.loss_agg_mode)
    expected.backward()
    assert torch.allclose(got, expected.detach())
    assert torch.allclose(lp.grad, ref_lp.grad)


def test_ratio_one_gives_plain_policy_gradient():
    lp = torch.zeros(1, 3, requires_grad=True)
    adv = torch.tensor([[2.0, 2.0, 2.0]])
    mask = torch.ones(1, 3)
    per_token, metrics = registry.build("loss", "clipped_pg", config=LossConfig())(
        LossInputs(lp, lp.detach(), adv, mask))
    aggregate(per_token, mask, "token-mean", 3, 1).backward()
    assert torch.allclose(lp.grad, torch.full((1, 3), -2.0 / 3))
    assert float(metrics["clip_fraction"].sum()) == 0


def test_empty_mask_single_token_and_extreme_ratios_stay_finite():
    loss_fn = registry.build("loss", "clipped_pg", config=LossConfig(reference_policy_kl_penalty=0.1,
                                                                     ratio_clip_c=3.0))
    lp = torch.tensor([[-1e4, 0.0], [50.0, -50.0]], requires_grad=True)
    old = torch.tensor([[0.0, 0.0], [-50.0, 50.0]])
    inputs = LossInputs(lp, old, torch.tensor([[1.0, 1.0], [-1.0, -1.0]]), torch.zeros(2, 2), ref_logprobs=old)
    per_token, _ = loss_fn(inputs)
    value = aggregate(per_token, torch.zeros(2, 2), "token-mean", 0.0, 2.0)
    value.backward()
    assert value == 0 and torch.isfinite(per_token).all() and torch.isfinite(lp.grad).all()
    single = aggregate(per_token[:1, :1], torch.ones(1, 1), "seq-mean-token-mean", 1.0, 1.0)
    assert torch.isfinite(single)


@pytest.mark.parametrize("kind", ["k1", "k2", "k3"])
def test_kl_estimators_are_zero_on_identical_policies(kind):
    x = torch.randn(4, 6)
    assert torch.allclose(kl_estimate(x, x, kind), torch.zeros(4, 6))


def test_k3_is_an_unbiased_kl_estimate():
    torch.manual_seed(0)
    p = torch.softmax(torch.randn(10), 0)
    q = torch.softmax(torch.randn(10), 0)
    samples = torch.multinomial(p, 200_000, replacement=True)
    estimate = kl_estimate(p.log()[samples], q.log()[samples], "k3").mean()
    exact = (p * (p.log() - q.log())).sum()
    assert abs(float(estimate - exact)) < 0.01
