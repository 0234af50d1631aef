"""GRPO advantages against a plain-Python computation of each normalisation mode."""

import statistics

import pytest
import torch

from dockyard import registry


def reference(rewards, group_size, mode, eps=1e-6):
    groups = [rewards[i:i + group_size] for i in range(0, len(rewards), group_size)]
    if mode == "none":
        return rewards
    if mode.startswith("batch"):
        mean = statistics.fmean(rewards)
        std = statistics.stdev(rewards) if len(rewards) > 1 else 0.0
        return [(r - mean) / (std + eps) if mode == "batch_zscore" else r - mean for r in rewards]
    out = []
    for group in groups:
        mean = statistics.fmean(group)
        std = statistics.stdev(group) if len(group) > 1 else 0.0
        out += [(r - mean) / (std + eps) if mode == "group_zscore" else r - mean for r in group]
    return out


@pytest.mark.parametrize("mode", ["none", "group_mean", "group_zscore", "batch_mean", "batch_zscore"])
def test_matches_reference(mode):
    torch.manual_seed(0)
    rewards = torch.rand(12).tolist()
    estimator = registry.build("advantage_estimator", "grpo", norm_mode=mode)
    got = estimator(torch.tensor(rewards), [4, 4, 4])
    assert torch.allclose(got, torch.tensor(reference(rewards, 4, mode), dtype=torch.float32), atol=1e-5)


def test_all_equal_rewards_give_zero_advantage_not_nan():
    estimator = registry.build("advantage_estimator", "grpo", norm_mode="group_zscore")
    got = estimator(torch.ones(8), [4, 4])
    assert torch.equal(got, torch.zeros(8))


def test_group_modes_refuse_unequal_groups():
    estimator = registry.build("advantage_estimator", "grpo", norm_mode="group_mean")
    with pytest.raises(ValueError, match="needs equal group sizes"):
        estimator(torch.rand(7), [4, 3])
    assert registry.build("advantage_estimator", "grpo", norm_mode="batch_mean")(torch.rand(7), [4, 3]).shape == (7,)


def test_single_sample_groups_are_centred_not_scaled():
    got = registry.build("advantage_estimator", "grpo", norm_mode="group_zscore")(torch.tensor([1.0, 0.0]), [1, 1])
    assert torch.equal(got, torch.zeros(2))
