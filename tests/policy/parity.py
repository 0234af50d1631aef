"""What the backend parity tests compare: two runs of backend_worker.py on the same weights and batch."""

import pytest
import torch


def max_diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    assert [x.shape for x in a] == [y.shape for y in b]
    return max(float((x - y).abs().max()) for x, y in zip(a, b))


def assert_trains_like(got: dict, want: dict) -> None:
    """The same logprobs before and after the steps (1e-4), the same step figures (1e-3 relative), steps
    that moved the policy, and the same serving weights under the same HF names."""
    assert max_diff(got["before"], want["before"]) <= 1e-4
    for mine, theirs in zip(got["steps"], want["steps"]):
        for name in [n for n in ("loss", "grad_norm", "entropy") if n in theirs]:   # SFT's loss has no entropy
            assert mine[name] == pytest.approx(theirs[name], rel=1e-3), name
    assert max_diff(got["after"], want["after"]) <= 1e-4
    assert max_diff(got["after"], got["before"]) > 1e-3    # the steps moved the policy
    assert set(got["serving"]) == set(want["serving"])
    assert max(float((got["serving"][n] - want["serving"][n]).abs().max()) for n in want["serving"]) <= 1e-4


def assert_resumes_exactly(got: dict) -> None:
    """Step 2 again after resuming from step 1's checkpoint: the same figures and weights; a reference
    loaded from that step: the weights after step 1."""
    assert got["again"] == got["steps"][1]
    assert max_diff(got["resumed_after"], got["after"]) == 0.0
    assert max_diff(got["reference"], got["after_one"]) == 0.0
