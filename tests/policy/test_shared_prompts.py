"""Shared-prompt rows (policy.dynamic_batching.share_prompts) give the logprobs, entropies and the
optimizer step of one row per sample, on the tiny model in fp32."""

import pytest
import torch

from dockyard import registry
from dockyard.config import load_config
from dockyard.policy.samples import Sample, plan_shared_prompt_rows


def groups():
    """Three prompts of different lengths, three responses each of different lengths, interleaved."""
    prompts = [[5, 9, 14, 3], [7, 7, 2, 11, 30, 4, 8], [12, 6]]
    responses = [[[21, 22, 23], [24], [25, 26, 27, 28, 29]], [[31, 32], [33, 34, 35, 36], [37]],
                 [[41, 42, 43, 44], [45, 46], [47, 48, 49]]]
    samples = []
    for k in range(3):
        for p, prompt in enumerate(prompts):
            samples.append(Sample(token_ids=prompt + responses[p][k], prompt_length=len(prompt),
                                  advantage=float((-1) ** (p + k)) * (k + 1) / 2))
    return samples


def test_rows_hold_each_prompt_once_within_the_budget():
    samples = groups()
    assert plan_shared_prompt_rows(samples, 64) == [[0, 3, 6], [1, 4, 7], [2, 5, 8]]
    # prompt 0 (4 tokens) + responses 3, 1, 5: the third no longer fits in 9 tokens
    assert plan_shared_prompt_rows(samples, 9)[:2] == [[0, 3], [1]]
    assert sorted(i for row in plan_shared_prompt_rows(samples, 9) for i in row) == list(range(9))


def build(world, tiny_model, *overrides):
    cfg = load_config("grpo_tiny.yaml", [f"models_dir={tiny_model.parent}", "policy.precision=fp32",
                                         "policy.dynamic_batching.enabled=true", "loss_fn.entropy_coef=0.01",
                                         *overrides]).config
    policy = registry.build("policy_backend", "dtensor", config=cfg, world=world, device=torch.device("cpu"),
                            total_optimizer_steps=4)
    return policy, registry.build("loss", cfg.loss_fn.name, config=cfg.loss_fn)


@pytest.mark.parametrize("budget, attention", [(128, "sdpa"), (16, "sdpa"), (128, "eager")])
def test_shared_prompt_rows_match_one_row_per_sample(single_rank_world, tiny_model, budget, attention):
    torch.manual_seed(0)
    # a 16-token budget splits prompts over several rows and rows over several micro-batches
    sizes = [f"policy.dynamic_batching.max_tokens_per_gpu={budget}", f"policy.max_total_sequence_length={budget}",
             "policy.generation.max_new_tokens=8"]
    plain, loss = build(single_rank_world, tiny_model, *sizes)
    shared, _ = build(single_rank_world, tiny_model, *sizes, "policy.dynamic_batching.share_prompts=true")
    if attention == "eager":
        shared.model.set_attn_implementation("eager")
    samples = groups()

    for a, b in zip(plain.logprobs(samples), shared.logprobs(samples)):
        assert a.shape == b.shape
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    plain_metrics = plain.train_mini_batch(samples, None, None, loss)
    shared_metrics = shared.train_mini_batch(samples, None, None, loss)
    for name in ("loss", "entropy", "grad_norm"):
        assert shared_metrics[name] == pytest.approx(plain_metrics[name], rel=1e-4, abs=1e-6), name
    before = registry.build("policy_backend", "dtensor", config=plain.config, world=single_rank_world,
                            device=torch.device("cpu"), total_optimizer_steps=0, trainable=False).full_state_dict()
    after_plain, after_shared = plain.full_state_dict(), shared.full_state_dict()
    assert any(not torch.equal(before[k], after_plain[k]) for k in before)
    for key in after_plain:
        # Adam's first step is about lr x sign(g): a gradient within summation-order noise of zero can
        # move an element by a fraction of lr either way; a wrong mask or position moves most by ~lr (1e-3)
        torch.testing.assert_close(after_shared[key], after_plain[key], atol=1e-4, rtol=1e-3)


def test_an_attention_without_4d_masks_is_refused_by_name(single_rank_world, tiny_model, monkeypatch):
    from transformers import AutoModelForCausalLM

    from dockyard.policy import dtensor

    monkeypatch.setattr(dtensor, "load_causal_lm", lambda path, dtype: AutoModelForCausalLM.from_pretrained(
        path, dtype=dtype, attn_implementation="flex_attention"))
    with pytest.raises(dtensor.PolicySetupError, match="share_prompts needs sdpa or eager attention .*flex_attention"):
        build(single_rank_world, tiny_model, "policy.dynamic_batching.share_prompts=true")
