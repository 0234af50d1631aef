"""Tokens with loss mask 0 (older-weights tokens of a partial rollout, observations of a multi-turn
episode) carry no gradient: they only condition the tokens after them."""

import pytest
import torch

from dockyard import registry
from dockyard.config import load_config
from dockyard.policy.samples import Sample


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


def test_is_weights_from_the_training_forward_equal_a_separate_logprob_pass(single_rank_world, tiny_model):
    """One optimizer step per batch with IS correction by clipping: the weights computed from the
    training forward's own logprobs (no separate pass) train exactly like precomputed ones."""
    from dockyard.loop.off_policy_safeguards import apply_safeguards

    cfg = load_config("grpo_tiny.yaml", [f"models_dir={tiny_model.parent}", "loss_fn.is_correction.enabled=true",
                                         "loss_fn.is_correction.lower_bound=0.8", "loss_fn.is_correction.upper_bound=1.2"]
                      ).config.loss_fn

    separate, loss = build(single_rank_world, tiny_model)
    prompts = [[5, 9, 14, 3, 8], [7, 7, 2], [12, 6, 40]]
    plain = [Sample(prompt + [21 + k, 22, 23 + k, 24], len(prompt), advantage=(-1.0) ** k)
             for k, prompt in enumerate(prompts)]
    torch.manual_seed(3)
    # a sampler whose logprobs differ from the trainer's by up to ~0.3 nats: some weights get clipped
    sampler = [(lp + 0.15 * torch.randn(lp.shape)).tolist() for lp in separate.logprobs(plain)]

    def samples():
        return [Sample(s.token_ids, s.prompt_length, advantage=s.advantage, rollout_logprobs=lp)
                for s, lp in zip(plain, sampler)]

    batch = samples()
    figures = apply_safeguards(cfg, batch, separate.logprobs(batch))
    expected = separate.train_mini_batch(batch, None, None, loss)

    fused, _ = build(single_rank_world, tiny_model)
    batch = samples()
    seen = []
    got = fused.train_mini_batch(batch, None, None, loss,
                                 before_loss=lambda mb, old: seen.append(apply_safeguards(cfg, mb, old)))
    assert 0 < figures["safeguard/is_clipped_fraction"] < 1     # the clip did something
    assert got["grad_norm"] == pytest.approx(expected["grad_norm"], rel=1e-5)
    assert got["loss"] == pytest.approx(expected["loss"], rel=1e-5, abs=1e-7)
    assert sum(f["safeguard/is_weight_mean"] for f in seen) / len(seen) == pytest.approx(
        figures["safeguard/is_weight_mean"], rel=0.2)


def test_per_token_advantages_reach_the_loss_token_by_token(single_rank_world, tiny_model):
    """OPD's advantages are per token: at the sampling weights the clipped loss is -A_t per trained token."""
    prompt, response = [5, 9, 14, 3, 8], [21, 22, 23, 24]
    advantages = [0.5, -1.0, 2.0, 0.25]
    per_token = [Sample(prompt + response, len(prompt), token_advantages=advantages, loss_mask=[1, 1, 0, 1])]
    policy, loss = build(single_rank_world, tiny_model)
    got = policy.train_mini_batch(per_token, None, None, loss)
    assert got["loss"] == pytest.approx(-(0.5 - 1.0 + 0.25) / 3, abs=1e-6)
