"""Reward transforms and group filters against straightforward per-element reference computations."""

import math
import random

import pytest
import torch

from dockyard import registry
from dockyard.algorithms.group_filters import FAILED, enabled_filters
from dockyard.algorithms.reward_transforms import RolloutFacts, enabled_transforms, sequence_kl
from dockyard.config.schema.grpo import GRPOConfig


def grpo(**changes) -> GRPOConfig:
    return GRPOConfig.model_validate({"num_prompts_per_step": 2, "num_generations_per_prompt": 2, "max_num_steps": 1,
                                      **changes})


def facts(lengths, limits, valid) -> RolloutFacts:
    return RolloutFacts(torch.tensor(lengths), torch.tensor(limits), torch.tensor(valid, dtype=torch.bool))


def test_scaling_maps_the_source_range_linearly_and_clamps_outside_it():
    cfg = grpo(reward_scaling={"enabled": True, "source_min": -2, "source_max": 3, "target_min": 0, "target_max": 10})
    scale = registry.build("reward_transform", "scaling", config=cfg)
    raw = [random.Random(0).uniform(-4, 5) for _ in range(50)] + [-2, 3]
    got = scale(torch.tensor(raw, dtype=torch.float64), facts([1] * 52, [8] * 52, [True] * 52))
    for r, g in zip(raw, got.tolist()):
        expected = 0 + (min(max(r, -2), 3) + 2) * 10 / 5
        assert g == pytest.approx(expected)
    assert got.min() == 0 and got.max() == 10


def test_invalid_action_penalty_applies_only_to_unparsable_actions():
    penalise = registry.build("reward_transform", "invalid_action_penalty", config=grpo(invalid_action_penalty=-0.5))
    got = penalise(torch.tensor([1.0, 0.0, 1.0]), facts([3, 3, 3], [8, 8, 8], [True, False, False]))
    assert got.tolist() == [1.0, -0.5, 0.5]


@pytest.mark.parametrize("buffer", [1, 4, 16])
def test_overlong_shaping_ramps_to_the_full_penalty_at_the_limit(buffer):
    cfg = grpo(reward_shaping={"enabled": True, "overlong_buffer_length": buffer, "overlong_penalty": 0.8})
    shape = registry.build("reward_transform", "overlong_shaping", config=cfg)
    limit = 8
    lengths = list(range(0, limit + 1))
    got = shape(torch.zeros(len(lengths), dtype=torch.float64), facts(lengths, [limit] * len(lengths),
                                                                      [True] * len(lengths)))
    b = min(buffer, limit)
    for length, value in zip(lengths, got.tolist()):
        if length <= limit - b:
            expected = 0.0
        else:
            expected = -0.8 * (length - (limit - b)) / b
        assert value == pytest.approx(expected)
    assert got[-1] == pytest.approx(-0.8)
    assert not torch.isnan(got).any()


def test_transforms_run_in_the_documented_order_and_only_when_configured():
    assert enabled_transforms(grpo()) == []
    cfg = grpo(reward_shaping={"enabled": True}, invalid_action_penalty=-1.0, reward_scaling={"enabled": True})
    assert enabled_transforms(cfg) == ["scaling", "invalid_action_penalty", "overlong_shaping"]


@pytest.mark.parametrize("kind", ["k1", "k2", "k3"])
def test_sequence_kl_sums_the_estimator_over_trained_tokens(kind):
    gen = torch.Generator().manual_seed(1)
    old = [torch.randn(n, generator=gen) for n in (1, 4, 7)]
    ref = [torch.randn(n, generator=gen) for n in (1, 4, 7)]
    masks = [torch.ones(1), torch.tensor([1.0, 0.0, 1.0, 1.0]), torch.zeros(7)]
    got = sequence_kl(old, ref, masks, kind)
    for value, o, r, m in zip(got.tolist(), old, ref, masks):
        expected = 0.0
        for a, b, keep in zip(o.tolist(), r.tolist(), m.tolist()):
            d = a - b
            expected += keep * {"k1": d, "k2": 0.5 * d * d, "k3": math.exp(-d) + d - 1}[kind]
        assert value == pytest.approx(expected, rel=1e-6, abs=1e-9)
    assert got[2] == 0.0  # an empty mask adds nothing


def test_sequence_kl_stays_finite_on_extreme_log_ratios():
    got = sequence_kl([torch.tensor([-80.0, 0.0])], [torch.tensor([0.0, -80.0])], [torch.ones(2)], "k3")
    assert torch.isfinite(got).all()


class T:
    def __init__(self, reward, status="ok"):
        self.reward, self.status = reward, status


def test_group_filters():
    status = registry.build("group_filter", "status", config=grpo())
    identical = registry.build("group_filter", "identical_reward", config=grpo())
    assert status([T(1.0), T(0.0)]) and not status([T(1.0), T(0.0, FAILED)])
    assert identical([T(1.0), T(0.0)]) and not identical([T(0.5), T(0.5), T(0.5)]) and not identical([T(1.0)])
    assert enabled_filters(grpo()) == ["status"]
    assert enabled_filters(grpo(filters={"status": False, "identical_reward": True})) == ["identical_reward"]


def test_every_algorithm_option_is_a_listed_component():
    from dockyard.cli import main

    for kind, names in {"kl_estimator": ["k1", "k2", "k3"], "safeguard": ["is_correction", "m2po", "opsm"],
                        "reward_transform": ["invalid_action_penalty", "overlong_shaping", "scaling"],
                        "group_filter": ["identical_reward", "status"], "loss": ["clipped_pg", "gspo"]}.items():
        assert registry.names(kind) == names
        assert all(registry.get(kind, name).available for name in names)
    assert main(["list", "reward_transform"]) == 0
