"""The dtensor policy on a vision-language model (the tiny random Idefics3 of tools/make_tiny_model.py):
a sample's compact placeholders are expanded and its PNGs become pixel values as transformers' own
processor makes them, for placeholders in the prompt and in observations after a reply alike."""

import io
import subprocess
import sys

import pytest
import torch
from PIL import Image

from dockyard import registry
from dockyard.config import load_config
from dockyard.policy.dtensor import DTensorPolicy
from dockyard.policy.samples import PolicySetupError, Sample
from tests.conftest import REPO


@pytest.fixture(scope="module")
def tiny_vlm(tmp_path_factory):
    out = tmp_path_factory.mktemp("models") / "tiny-vlm"
    subprocess.run([sys.executable, str(REPO / "tools" / "make_tiny_model.py"), "--arch", "idefics3", "--out", str(out)],
                   check=True, capture_output=True, timeout=300)
    return out


def png(colour, size=(80, 40)) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size, colour).save(buffer, "PNG")
    return buffer.getvalue()


def config(tiny_vlm, *overrides):
    return load_config("grpo_tiny.yaml", [f"models_dir={tiny_vlm.parent}", f"policy.model_name={tiny_vlm}",
                                          *overrides]).config


def test_logprobs_are_transformers_own_and_a_step_trains_the_vision_tower(tiny_vlm, single_rank_world):
    from transformers import AutoModelForImageTextToText, AutoProcessor

    processor = AutoProcessor.from_pretrained(tiny_vlm)
    encode = lambda text: processor.tokenizer(text, add_special_tokens=False)["input_ids"]   # noqa: E731
    prompt, observation = encode("<|user|>look at <image> now<|end|><|assistant|>"), \
        encode("<|end|><|user|>then <image><|end|><|assistant|>")
    tokens = prompt + [5, 6, 7, 8] + observation + [9, 10, 11]
    pictures = [png((255, 0, 0)), png((0, 0, 255), (30, 90))]
    sample = Sample(tokens, len(prompt), advantage=1.0, images=pictures,
                    loss_mask=[1] * 4 + [0] * len(observation) + [1] * 3)
    policy = DTensorPolicy(config(tiny_vlm), single_rank_world, torch.device("cpu"), total_optimizer_steps=1)
    [mine, text_only] = policy.logprobs([sample, Sample([3, 4, 5, 6, 7], 2, advantage=-1.0)])
    assert mine.shape == (len(tokens) - len(prompt),) and text_only.shape == (3,)

    # the reference: the processor expands the decoded text's placeholders and makes the pixels itself
    model = AutoModelForImageTextToText.from_pretrained(tiny_vlm, dtype=torch.float32).eval()
    inputs = processor(text=[processor.tokenizer.decode(tokens)], add_special_tokens=False, return_tensors="pt",
                       images=[[Image.open(io.BytesIO(p)).convert("RGB") for p in pictures]])
    expanded = inputs["input_ids"][0]
    with torch.no_grad():
        reference = torch.log_softmax(model(**inputs).logits[0] / policy.temperature, dim=-1)
    grown = (len(expanded) - len(tokens)) // 2         # each of the two placeholders grew by as many tokens
    first = [len(prompt) + grown + i for i in range(4)]
    last = [len(expanded) - 3 + i for i in range(3)]
    expected = torch.tensor([float(reference[p - 1, expanded[p]]) for p in first + last])
    trained = torch.cat([mine[:4], mine[-3:]])
    assert torch.allclose(trained, expected, atol=1e-5), (trained - expected).abs().max()

    whole = lambda p: p.full_tensor() if hasattr(p, "full_tensor") else p   # noqa: E731
    before = {n: whole(p).clone() for n, p in policy.model.named_parameters() if "vision_model" in n}
    loss = registry.build("loss", "clipped_pg", config=policy.config.loss_fn)
    figures = policy.train_mini_batch([sample, Sample([3, 4, 5, 6, 7], 2, advantage=-1.0)], None, None, loss)
    assert torch.isfinite(torch.tensor(figures["loss"])) and figures["grad_norm"] > 0
    moved = [n for n, p in policy.model.named_parameters() if n in before and not torch.equal(whole(p), before[n])]
    assert moved, "the vision tower got no gradient: the pixels did not reach the loss"


def test_a_text_model_given_images_and_unbuilt_layouts_are_refused_by_name(tiny_vlm, tiny_model, single_rank_world):
    text = DTensorPolicy(load_config("grpo_tiny.yaml", [f"models_dir={tiny_model.parent}"]).config, single_rank_world,
                         torch.device("cpu"), total_optimizer_steps=1)
    with pytest.raises(PolicySetupError, match="not a vision-language model"):
        text.logprobs([Sample([3, 4, 5], 1, images=[png((0, 0, 0))])])
    with pytest.raises(PolicySetupError, match="share_prompts are not built for image inputs"):
        DTensorPolicy(config(tiny_vlm, "policy.dynamic_batching.enabled=true", "policy.dynamic_batching.share_prompts=true"),
                      single_rank_world, torch.device("cpu"), total_optimizer_steps=1)
