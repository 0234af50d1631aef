"""SFT: the loss sees assistant tokens only, packing changes no number, and `dockyard run` trains,
validates (loss and generation accuracy), checkpoints and resumes exactly (in this process: loop_run;
the Slurm SFT template runs it as processes)."""

import json

import pytest
import torch

from dockyard.config import load_config
from dockyard.data.conversations import conversation_tokens
from dockyard.loop.sft import NextTokenLoss
from dockyard.models import load_causal_lm, load_tokenizer
from dockyard.policy.samples import Sample
from dockyard.policy.dtensor import DTensorPolicy
from tests.run.test_local_run import final_weights

CONVERSATIONS = [[{"role": "user", "content": f"{a} + {b} = ?"}, {"role": "assistant", "content": f"{a + b}"},
                  {"role": "user", "content": "times 2?"}, {"role": "assistant", "content": f"{2 * (a + b)}"}]
                 for a in range(1, 7) for b in range(1, 7)]


def sft_overrides(tmp_path, *extra):
    train = tmp_path / "chat.jsonl"
    train.write_text("".join(json.dumps({"messages": c}) + "\n" for c in CONVERSATIONS))
    val = tmp_path / "val.jsonl"
    val.write_text("".join(json.dumps({"messages": c[:2], "answer": c[1]["content"]}) + "\n"
                           for c in CONVERSATIONS[:6]))
    return ("+sft={max_num_steps: 4, val_period: 2, max_num_epochs: 10}", "grpo.max_num_steps=1", "checkpointing.save_period=2",
            "policy.dynamic_batching={enabled: true, max_tokens_per_gpu: 256}",
            f"data.datasets=[{{name: chat, path: {train}, input_key: messages, label_key: null}}]",
            f"data.validation={{name: val, path: {val}, input_key: messages, label_key: answer, shuffle: false}}",
            *extra)


def policy_on(tiny_model, world, packing: bool):
    cfg = load_config("grpo_tiny.yaml", [f"models_dir={tiny_model.parent}",
                                         "policy.dynamic_batching={enabled: true, max_tokens_per_gpu: 256}"]).config
    policy = DTensorPolicy(cfg, world, torch.device("cpu"), total_optimizer_steps=1)
    policy.temperature, policy.share_prompts = 1.0, packing
    return policy


def test_sft_loss_is_the_nll_of_assistant_tokens_only_packed_or_not(tiny_model, single_rank_world):
    tokenizer = load_tokenizer(tiny_model)
    pairs = [conversation_tokens(tokenizer, c) for c in CONVERSATIONS[:5]]
    samples = [Sample(token_ids=ids, prompt_length=1, loss_mask=mask[1:]) for ids, mask in pairs]
    # plain reference: transformers' logprobs, averaged over the assistant tokens of all conversations
    model = load_causal_lm(tiny_model).eval()
    total, count = 0.0, 0
    for ids, mask in pairs:
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0, :-1]
        nll = -torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids[1:])[:, None])[:, 0]
        keep = torch.tensor(mask[1:], dtype=torch.bool)
        assert 0 < keep.sum() < len(keep)        # user turns are there, untrained
        total, count = total + float(nll[keep].sum()), count + int(keep.sum())
    losses = [policy_on(tiny_model, single_rank_world, packing).train_mini_batch(
        samples, None, None, NextTokenLoss())["loss"] for packing in (False, True)]
    assert losses[0] == pytest.approx(total / count, abs=1e-4)
    assert losses[1] == pytest.approx(losses[0], abs=1e-5)


def test_sft_run_trains_validates_and_resumes_exactly(loop_run, tmp_path):
    straight, split = tmp_path / "straight", tmp_path / "split"
    for folder in (straight, split):
        folder.mkdir()
    loop_run(straight, *sft_overrides(straight))
    rows = [json.loads(line) for line in (straight / "runs/grpo_tiny/logs/metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert rows[-1]["train/loss"] < rows[0]["train/loss"]
    assert rows[-1]["val/loss"] < rows[1]["val/loss"]
    assert "val/accuracy" in rows[1] and rows[0]["data/trained_tokens"] < rows[0]["data/tokens"]
    answers = (straight / "runs/grpo_tiny/logs/validation/step_2.jsonl").read_text().splitlines()
    assert len(answers) == 6 and json.loads(answers[0])["prompt"] == CONVERSATIONS[0][:1]   # asked without the reply

    # the same run stopped after step 2 and resumed gives the same weights
    loop_run(split, *sft_overrides(split, "sft.max_num_steps=2"))
    second = loop_run(split, *sft_overrides(split))
    assert "resumed from" in second.output, second.output
    a, b = final_weights(straight, 4), final_weights(split, 4)
    for name in a:
        torch.testing.assert_close(a[name], b[name], atol=0, rtol=0)


def test_sft_ends_after_its_epochs(loop_run, tmp_path):
    # 36 conversations, 16 a step: the first epoch ends in step 3
    loop_run(tmp_path, *sft_overrides(tmp_path, "sft={max_num_steps: 50, max_num_epochs: 1, val_period: 0}"))
    rows = [json.loads(line) for line in (tmp_path / "runs/grpo_tiny/logs/metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3] and rows[-1]["data/epoch"] == 1
    assert (tmp_path / "runs/grpo_tiny/checkpoints/step_3").is_dir()
