"""policy.dtensor_cfg.tensor_parallel_size and context_parallel_size: TP 2, TP 2 x DP 2, CP 2 and
CP 2 x DP 2 (real gloo worlds of 2 and 4 processes) give the logprobs, losses, gradient norms and
weights of one rank after three optimizer steps, for Llama (tied and untied) and Qwen3 (whose per-head
norms need their gradients summed over the TP group); every sample is longer than one CP shard; the
CP 2 x DP 2 world also recomputes activations (activation checkpointing re-gathers K/V in backward).
A TP 2 checkpoint resumes on one rank; a model whose heads do not split is refused by name before
the run."""

from pathlib import Path

import pytest
import torch

from tests.conftest import run_cli
from tests.policy.worlds import launch_world

WORKER = Path(__file__).with_name("parallel_worker.py")


def launch(world: int, tp: int, *args: str, timeout: int = 300) -> None:
    launch_world(world, [str(WORKER), "--tp", str(tp), *args], timeout)


@pytest.fixture(scope="module")
def runs(tiny_model, tiny_tied_model, tiny_qwen3_model, tmp_path_factory):
    """Every world's results, {(world, tp): {model folder name: results}} ((world, "cp2") for the CP
    worlds); the TP 2 world also saves the untied Llama's checkpoint, which a one-rank world then loads
    (the 'resume' entry)."""
    root = tmp_path_factory.mktemp("parallel")
    folders = {key: root / f"w{key[0]}tp{key[1]}" for key in [(1, 1), (2, 2), (4, 2), ("resume", 1), (2, "cp2"),
                                                              (4, "cp2")]}
    for folder in folders.values():
        folder.mkdir()
    checkpoint = root / "checkpoint"
    launch(1, 1, "--model", str(tiny_model), "--model", f"{tiny_tied_model}:shared", "--model", str(tiny_qwen3_model),
           "--out", str(folders[(1, 1)]))
    launch(2, 2, "--model", str(tiny_qwen3_model), "--model", str(tiny_model), "--out", str(folders[(2, 2)]),
           "--save", str(checkpoint))
    launch(4, 2, "--model", f"{tiny_tied_model}:shared", "--out", str(folders[(4, 2)]))
    launch(1, 1, "--model", str(tiny_model), "--out", str(folders[("resume", 1)]), "--load", str(checkpoint),
           "--steps", "0")
    launch(2, 1, "--cp", "2", "--model", str(tiny_qwen3_model), "--model", str(tiny_model), "--out",
           str(folders[(2, "cp2")]))
    launch(4, 1, "--cp", "2", "--model", str(tiny_tied_model), "--out", str(folders[(4, "cp2")]),
           "--set", "policy.dtensor_cfg.activation_checkpointing=true")
    return {key: {p.stem: torch.load(p, weights_only=False) for p in folder.glob("*.pt")}
            for key, folder in folders.items()}


def assert_same_run(got: dict, want: dict) -> None:
    for step, (mine, theirs) in enumerate(zip(got["steps"], want["steps"])):
        for name in ("loss", "grad_norm"):
            assert mine[name] == pytest.approx(theirs[name], rel=2e-6, abs=1e-7), (step, name)
    for mine, theirs in zip(got["logprobs"], want["logprobs"]):
        torch.testing.assert_close(mine, theirs, rtol=0, atol=2e-5)
    # entropy rows are right-aligned [B, R]; outside a sample's response they depend on the row layout
    for row, logprobs in enumerate(want["logprobs"]):
        n = logprobs.shape[0]
        torch.testing.assert_close(got["entropy"][row, -n:], want["entropy"][row, -n:], rtol=0, atol=2e-5)
    assert got["weights"].keys() == want["weights"].keys()
    for name in want["weights"]:
        torch.testing.assert_close(got["weights"][name], want["weights"][name], rtol=0, atol=2e-5, msg=name)


@pytest.mark.parametrize("model, world", [("tiny-llama", (2, 2)), ("tiny-qwen3", (2, 2)),
                                          ("tiny-llama-tied", (4, 2)), ("tiny-llama", (2, "cp2")),
                                          ("tiny-qwen3", (2, "cp2")), ("tiny-llama-tied", (4, "cp2"))])
def test_tensor_and_context_parallel_train_as_one_rank(runs, model, world):
    one, split = runs[(1, 1)][model], runs[world][model]
    assert one["moved"] > 100 * 2e-5   # equal weights after the steps mean equal updates
    assert_same_run(split, one)


def test_a_tensor_parallel_checkpoint_resumes_on_one_rank(runs):
    saved, loaded = runs[(2, 2)]["tiny-llama"], runs[("resume", 1)]["tiny-llama"]
    for name in saved["weights"]:
        assert torch.equal(saved["weights"][name], loaded["weights"][name]), name
    assert saved["exp_avg"].keys() == loaded["exp_avg"].keys()
    for name in saved["exp_avg"]:
        assert torch.equal(saved["exp_avg"][name], loaded["exp_avg"][name]), name
        assert saved["exp_avg"][name].abs().sum() > 0, name


def test_heads_that_do_not_split_are_refused_before_the_run(tiny_model):
    result = run_cli("run", "--config", "grpo_tiny.yaml", f"models_dir={tiny_model.parent}",
                     "policy.dtensor_cfg.tensor_parallel_size=4", "cluster.cpu_ranks_per_node=2")
    assert result.returncode == 2, result.stderr
    assert "policy.dtensor_cfg.tensor_parallel_size" in result.stderr
    assert "num_key_value_heads = 2, which 4 ranks cannot split evenly" in result.stderr
