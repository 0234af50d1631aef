"""Hugging Face folders written from trained weights: the folder itself (config, tokenizer and one
`model.safetensors`) and the `hf` link to the newest one. Written at save time (io/checkpoint.py)
and by `dockyard export hf` (io/hf_export.py).

A folder is the trained weights as one `model.safetensors` (float32: the master weights, exactly)
plus every non-weight file of the model folder the run started from (config, generation config,
tokenizer, chat template). It is written next to its final place and renamed into it, so a
half-written folder is never mistaken for a model.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

from dockyard.models import model_folder

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".msgpack", ".h5")
LATEST_LINK = "hf"


def _non_weight_files(source: Path) -> list[Path]:
    return [p for p in sorted(source.iterdir()) if p.is_file() and not p.name.endswith(WEIGHT_SUFFIXES)
            and not p.name.endswith(".index.json")]


def write_hf_folder(weights: dict[str, torch.Tensor], source: str | Path, out: str | Path,
                    skip: set[str] = frozenset()) -> Path:
    """Write `weights` (full, unsharded; names as the source model's state dict) as an HF folder at `out`,
    with the non-weight files of `source`. `skip`: aliases (a tied lm_head) the loader re-ties itself."""
    source, out = model_folder(source), Path(out)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    tensors = {name: tensor.detach().to("cpu", torch.float32).contiguous() for name, tensor in weights.items()
               if name not in skip}
    save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    for path in _non_weight_files(source):
        shutil.copy2(path, tmp / path.name)
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
    return out


def point_latest(checkpoint_dir: str | Path, step_hf: str | Path) -> Path:
    """Make <checkpoint_dir>/hf name `step_hf` (a relative link, replaced atomically)."""
    root = Path(checkpoint_dir)
    link = root / LATEST_LINK
    tmp = root / (LATEST_LINK + ".link.tmp")
    if tmp.is_symlink() or tmp.exists():
        tmp.unlink()
    os.symlink(os.path.relpath(step_hf, root), tmp)
    os.replace(tmp, link)
    return link
