"""The dtensor policy on vision-language models (tiny random ones from tools/make_tiny_model.py: Idefics3,
SmolVLM's architecture, and Qwen2-VL / Qwen2.5-VL with their 3-D rotary positions): a sample's compact placeholders are
expanded and its PNGs become pixel values as transformers' own image processing makes them, for
placeholders in the prompt and in observations after a reply alike, in a left-padded batch beside a
text-only row."""

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

PROMPTS = {"idefics3": ("<|user|>look at <image> now<|end|><|assistant|>", "<|end|><|user|>then <image><|end|><|assistant|>"),
           "qwen2_vl": ("<|user|>look at <|vision_start|><|image_pad|><|vision_end|> now<|end|><|assistant|>",
                        "<|end|><|user|>then <|vision_start|><|image_pad|><|vision_end|><|end|><|assistant|>")}
PROMPTS["qwen2_5_vl"] = PROMPTS["qwen2_vl"]


@pytest.fixture(scope="module", params=list(PROMPTS))
def tiny_vlm(request, tmp_path_factory):
    out = tmp_path_factory.mktemp("models") / f"tiny-{request.param}"
    subprocess.run([sys.executable, str(REPO / "tools" / "make_tiny_model.py"), "--arch", request.param,
                    "--out", str(out)], check=True, capture_output=True, timeout=300)
    return request.param, out


def png(colour, size=(80, 40)) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size, colour).save(buffer, "PNG")
    return buffer.getvalue()


def config(model, *overrides):
    return load_config("grpo_tiny.yaml", [f"models_dir={model.parent}", f"policy.model_name={model}", *overrides]).config


def reference_logprobs(family, model_path, tokens, pictures, temperature):
    """transformers alone, one unpadded row: (expanded ids, log-softmax of every position)."""
    from transformers import AutoImageProcessor, AutoModelForImageTextToText, AutoProcessor, AutoTokenizer

    model = AutoModelForImageTextToText.from_pretrained(model_path, dtype=torch.float32).eval()
    images = [Image.open(io.BytesIO(p)).convert("RGB") for p in pictures]
    if family == "idefics3":   # the processor expands the decoded text's placeholders and makes the pixels itself
        processor = AutoProcessor.from_pretrained(model_path)
        inputs = processor(text=[processor.tokenizer.decode(tokens)], images=[images], add_special_tokens=False,
                           return_tensors="pt")
    else:   # Qwen2-VL's processor rule: <|image_pad|> once per merged patch of the image's grid
        processor, pad = AutoImageProcessor.from_pretrained(model_path), model.config.image_token_id
        pixels = processor(images=images, return_tensors="pt")
        counts = iter((pixels["image_grid_thw"].prod(-1) // processor.merge_size ** 2).tolist())
        ids = [t for token in tokens for t in ([pad] * next(counts) if token == pad else [token])]
        inputs = {"input_ids": torch.tensor([ids]), "mm_token_type_ids": (torch.tensor([ids]) == pad).long(), **pixels}
    with torch.no_grad():
        logits = model(**inputs).logits[0]
    return inputs["input_ids"][0], torch.log_softmax(logits / temperature, dim=-1)


def test_logprobs_are_transformers_own_and_a_step_trains_the_vision_tower(tiny_vlm, single_rank_world):
    from transformers import AutoTokenizer

    family, model_path = tiny_vlm
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    encode = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]   # noqa: E731
    prompt, observation = (encode(text) for text in PROMPTS[family])
    tokens = prompt + [5, 6, 7, 8] + observation + [9, 10, 11]
    pictures = [png((255, 0, 0)), png((0, 0, 255), (30, 90))]
    sample = Sample(tokens, len(prompt), advantage=1.0, images=pictures,
                    loss_mask=[1] * 4 + [0] * len(observation) + [1] * 3)
    text_only = Sample([3, 4, 5, 6, 7], 2, advantage=-1.0)
    policy = DTensorPolicy(config(model_path), single_rank_world, torch.device("cpu"), total_optimizer_steps=1)
    [mine, plain] = policy.logprobs([sample, text_only])
    assert mine.shape == (len(tokens) - len(prompt),) and plain.shape == (3,)

    expanded, reference = reference_logprobs(family, model_path, tokens, pictures, policy.temperature)
    ids = expanded.tolist()
    first_reply = next(i for i in range(len(ids)) if ids[i:i + 4] == [5, 6, 7, 8])
    positions = [first_reply + i for i in range(4)] + [len(ids) - 3 + i for i in range(3)]
    expected = torch.tensor([float(reference[p - 1, expanded[p]]) for p in positions])
    trained = torch.cat([mine[:4], mine[-3:]])
    assert torch.allclose(trained, expected, atol=1e-5), (trained - expected).abs().max()

    whole = lambda p: p.full_tensor() if hasattr(p, "full_tensor") else p   # noqa: E731
    before = {n: whole(p).clone() for n, p in policy.model.named_parameters() if "visual" in n or "vision_model" in n}
    assert before
    loss = registry.build("loss", "clipped_pg", config=policy.config.loss_fn)
    figures = policy.train_mini_batch([sample, text_only], None, None, loss)
    assert torch.isfinite(torch.tensor(figures["loss"])) and figures["grad_norm"] > 0
    moved = [n for n, p in policy.model.named_parameters() if n in before and not torch.equal(whole(p), before[n])]
    assert moved, "the vision tower got no gradient: the pixels did not reach the loss"


def test_a_text_model_given_images_and_unbuilt_layouts_are_refused_by_name(tiny_vlm, tiny_model, single_rank_world):
    _, model_path = tiny_vlm
    text = DTensorPolicy(load_config("grpo_tiny.yaml", [f"models_dir={tiny_model.parent}"]).config, single_rank_world,
                         torch.device("cpu"), total_optimizer_steps=1)
    with pytest.raises(PolicySetupError, match="not a vision-language model"):
        text.logprobs([Sample([3, 4, 5], 1, images=[png((0, 0, 0))])])
    with pytest.raises(PolicySetupError, match="share_prompts are not built for image inputs"):
        DTensorPolicy(config(model_path, "policy.dynamic_batching.enabled=true", "policy.dynamic_batching.share_prompts=true"),
                      single_rank_world, torch.device("cpu"), total_optimizer_steps=1)


def test_the_agent_writes_each_familys_placeholder_once_per_screenshot(tiny_vlm):
    from dockyard.agents.computer_use import ComputerUseAgent
    from dockyard.data.datasets import Prompt
    from dockyard.desktop.observation import DesktopObservation
    from dockyard.models import load_tokenizer
    from dockyard.vision import VisionInputs

    family, model_path = tiny_vlm
    vision = VisionInputs(model_path)
    assert vision.placeholder == {"idefics3": "<image>"}.get(family, "<|vision_start|><|image_pad|><|vision_end|>")
    tokenizer = load_tokenizer(model_path)
    agent = ComputerUseAgent(tokenizer, observation_type="screenshot", image_token=vision.image_token,
                             image_placeholder=vision.placeholder)
    seen = DesktopObservation(screenshot=png((9, 9, 9)), note=f"typed {vision.placeholder}")
    ids = agent.first_prompt(Prompt("open a terminal", None, {}, "osworld"), seen)
    assert ids.count(vision.image_token_id) == 1
    written = tokenizer(vision.placeholder, add_special_tokens=False)["input_ids"]
    assert any(ids[i:i + len(written)] == written for i in range(len(ids)))
    grown = vision.expand(ids, len(ids), [png((9, 9, 9))])
    assert len(grown.token_ids) == len(ids) + len(vision.expansion(png((9, 9, 9)))[0]) - 1


@pytest.mark.parametrize("family", ["idefics3", "qwen2_vl"])   # the two ways images enter a forward
def test_two_data_parallel_ranks_one_without_images_train_as_one_rank_with_both(family, tmp_path):
    """A rank whose micro-batch has no image still takes part in the vision tower's gradient reduction
    (without it FSDP's collective breaks: the other rank sends more bytes): the step over two ranks
    equals the step over one rank with both samples."""
    from tests.policy.worlds import launch_world

    model_path = tmp_path / f"tiny-{family}"
    subprocess.run([sys.executable, str(REPO / "tools" / "make_tiny_model.py"), "--arch", family, "--out", str(model_path)],
                   check=True, capture_output=True, timeout=300)
    worker = str(REPO / "tests" / "policy" / "vision_worker.py")
    launch_world(1, [worker, "--model", str(model_path), "--out", str(tmp_path / "one.pt")], 300)
    launch_world(2, [worker, "--model", str(model_path), "--out", str(tmp_path / "two.pt")], 300)
    one, two = torch.load(tmp_path / "one.pt"), torch.load(tmp_path / "two.pt")
    before, one, two = one["before"], one["after"], two["after"]
    assert one.keys() == two.keys()
    # a step moves weights by about lr (1e-3); the two worlds differ by summation order only
    assert max(float((one[n] - two[n]).abs().max()) for n in one) < 1e-4
    moved = [n for n in one if ("visual" in n or "vision_model" in n) and not torch.equal(one[n], before[n])]
    assert moved   # the image reached the step on both worlds

