"""Tokens with loss mask 0 (older-weights tokens of a partial rollout, observations of a multi-turn
episode) carry no gradient: they only condition the tokens after them."""

import pytest
import torch

from dockyard import registry
from dockyard.config import load_config
from dockyard.policy.dtensor import Sample


def build(world, tiny_model):
    cfg = load_config("grpo_tiny.yaml", [f"models_dir={tiny_model.parent}", "policy.precision=fp32",
                                         "loss_fn.entropy_coef=0.0"]).config
    policy = registry.build("policy_backend", "dtensor", config=cfg, world=world, device=torch.device("cpu"),
                            total_optimizer_steps=2)
    return policy, registry.build("loss", cfg.loss_fn.name, config=cfg.loss_fn)


def test_masked_response_tokens_train_exactly_like_prompt_tokens(single_rank_world, tiny_model):
    prompt, response = [5, 9, 14, 3, 8], [21, 22, 23, 24, 25, 26]
    masked = [Sample(prompt + response, len(prompt), advantage=1.0, loss_mask=[0, 0, 0, 1, 1, 1]),
              Sample([7, 7, 2] + response, 3, advantage=-1.0, loss_mask=[0, 0, 0, 1, 1, 1])]
    # the same sequences with the masked tokens moved into the prompt: nothing else differs
    moved = [Sample(prompt + response, len(prompt) + 3, advantage=1.0),
             Sample([7, 7, 2] + response, 3 + 3, advantage=-1.0)]
    first, loss = build(single_rank_world, tiny_model)
    second, _ = build(single_rank_world, tiny_model)
    a = first.train_mini_batch(masked, None, None, loss)
    b = second.train_mini_batch(moved, None, None, loss)
    assert a["grad_norm"] > 0
    assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-5)
    assert a["loss"] == pytest.approx(b["loss"], rel=1e-5, abs=1e-7)

    # with every response token masked there is nothing to learn from
    none, _ = build(single_rank_world, tiny_model)
    silent = [Sample(prompt + response, len(prompt), advantage=1.0, loss_mask=[0] * 6)]
    assert none.train_mini_batch(silent, None, None, loss)["grad_norm"] == 0.0
