"""Micro-batch planning and the learning-rate schedule of the dtensor backend."""

import math

import pytest

from dockyard.policy.samples import Sample, lr_factor, plan_micro_batches


def test_fixed_micro_batches_keep_order():
    assert plan_micro_batches([5, 9, 3, 7, 2], 2, None) == [[0, 1], [2, 3], [4]]


def test_token_budget_packs_by_length_within_the_budget():
    lengths = [10, 40, 12, 38, 11, 90]
    batches = plan_micro_batches(lengths, 1, 100)
    assert sorted(i for b in batches for i in b) == list(range(6))
    for batch in batches:
        assert max(lengths[i] for i in batch) * len(batch) <= 100 or len(batch) == 1
    assert [0, 2, 4] in [sorted(b) for b in batches]  # the three short ones share a micro-batch


def test_a_sequence_longer_than_the_budget_gets_its_own_micro_batch():
    assert plan_micro_batches([500, 10], 4, 100) == [[1], [0]]


@pytest.mark.parametrize("shape,step,expected", [
    ("constant", 0, 0.25), ("constant", 3, 1.0), ("constant", 50, 1.0),
    ("linear", 4, 1.0), ("linear", 54, 0.55), ("linear", 104, 0.1),
    ("cosine", 4, 1.0), ("cosine", 54, 0.1 + 0.9 * 0.5), ("cosine", 104, 0.1),
])
def test_warmup_then_shape(shape, step, expected):
    assert math.isclose(lr_factor(step, warmup=4, total=104, shape=shape, min_ratio=0.1), expected, abs_tol=1e-9)


def test_response_mask_follows_loss_mask():
    sample = Sample(token_ids=[1, 2, 3, 4, 5], prompt_length=2)
    assert sample.response_mask().tolist() == [1.0, 1.0, 1.0]
    masked = Sample(token_ids=[1, 2, 3, 4, 5], prompt_length=2, loss_mask=[1, 0, 1])
    assert masked.response_mask().tolist() == [1.0, 0.0, 1.0]
