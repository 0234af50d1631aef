"""Build a tiny random-weight causal LM with a locally trained BPE tokenizer, for tests and CI.

    python tools/make_tiny_model.py --out models/tiny-llama [--arch llama|qwen2] [--seed 0]

No network: the tokenizer is trained on arithmetic text generated here; the weights are seeded
random. The result is a normal transformers folder (config, safetensors, tokenizer with a chat
template) that every dockyard backend loads like any other model.
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


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="models/tiny-llama")
    parser.add_argument("--arch", choices=["llama", "qwen2"], default="llama")
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
        if existing.get("hidden_size") == HIDDEN_SIZE and existing.get("tie_word_embeddings", False) == args.tied:
            print(f"{out} exists; keeping it")
            return
        print(f"{out} was built by an older version of this tool (head size vLLM refuses); rebuilding it")
        shutil.rmtree(out)
    from dockyard.models import save_model_folder

    tokenizer = build_tokenizer(args.seed, args.vocab_size)
    model = build_model(args.arch, len(tokenizer), args.seed, tokenizer, args.tied)
    save_model_folder(model, tokenizer, out)
    print(f"wrote {out} ({sum(p.numel() for p in model.parameters())} parameters, vocab {len(tokenizer)})")


if __name__ == "__main__":
    main()
