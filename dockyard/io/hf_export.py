"""Hugging Face folders from trained weights: what the next stage of a recipe (a teacher, a GRPO run
from an SFT checkpoint) and other tools load.

A folder is the trained weights as one `model.safetensors` (float32: the master weights, exactly)
plus every non-weight file of the model folder the run started from (config, generation config,
tokenizer, chat template). It is written next to its final place and renamed into it, so a
half-written folder is never mistaken for a model.

    step_<N>/hf/                 written at save time with checkpointing.export_hf
    <checkpoint_dir>/hf          a link to the newest step's hf folder (what configs name)
    anywhere                     `dockyard export hf --checkpoint STEP|CHECKPOINT_DIR --out DIR` afterwards
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".msgpack", ".h5")
LATEST_LINK = "hf"


def _non_weight_files(source: Path) -> list[Path]:
    return [p for p in sorted(source.iterdir()) if p.is_file() and not p.name.endswith(WEIGHT_SUFFIXES)
            and not p.name.endswith(".index.json")]


def write_hf_folder(weights: dict[str, torch.Tensor], source: str | Path, out: str | Path,
                    skip: set[str] = frozenset()) -> Path:
    """Write `weights` (full, unsharded; names as the source model's state dict) as an HF folder at `out`,
    with the non-weight files of `source`. `skip`: aliases (a tied lm_head) the loader re-ties itself."""
    from safetensors.torch import save_file

    from dockyard.models import model_folder

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


def export_checkpoint(step_folder: str | Path, source: str | Path, out: str | Path) -> Path:
    """An HF folder from a saved dockyard step (model weights of its DCP checkpoint); `source` is the
    model folder that gives the structure and the tokenizer (the run's policy.model_name)."""
    from dockyard.io.checkpoint import load_model_weights
    from dockyard.models import load_causal_lm

    model = load_causal_lm(source, dtype=torch.float32)
    load_model_weights(step_folder, model)
    tied = set(model.state_dict()) - {n for n, _ in model.named_parameters()} - {n for n, _ in model.named_buffers()}
    return write_hf_folder(model.state_dict(), source, out, skip=tied)


class ExportError(RuntimeError):
    """A checkpoint that cannot be exported, with the reason (the CLI prints it without a traceback)."""


def step_folder_of(checkpoint: str | Path) -> Path:
    """A step folder, or a checkpoint_dir's newest complete step (its pointer)."""
    from dockyard.io.checkpoint import POINTER

    path = Path(checkpoint).expanduser()
    if (path / POINTER).is_file():
        path = path / f"step_{(path / POINTER).read_text().strip()}"
    if not (path / "trainer_state.json").is_file():
        raise ExportError(f"{path} is not a complete dockyard checkpoint step (no trainer_state.json); name a "
                          "step_<N> folder or the checkpoint_dir holding latest_checkpointed_iteration.txt")
    return path


def export_step(checkpoint: str | Path, out: str | Path, model: str | Path | None = None) -> Path:
    """`dockyard export hf`: the HF folder of a saved step. `model` (default: the folder the run trained,
    as the step records it) gives the architecture, config and tokenizer."""
    import json

    from dockyard.io.checkpoint import CheckpointLoadError, contents
    from dockyard.models import ModelLoadError, ModelNotFoundError

    step = step_folder_of(checkpoint)
    held = contents(json.loads((step / "trainer_state.json").read_text()))
    if held["adapters_only"]:
        where = f"; its merged weights are in {step / 'hf'}" if held["hf"] else " (checkpointing.export_hf writes them at save time)"
        raise ExportError(f"{step} holds LoRA adapters only, not the model's weights{where}")
    source = model or held["model"]
    if source is None:
        raise ExportError(f"{step} does not record the model folder it trained; pass --model FOLDER (the run's "
                          "policy.model_name)")
    try:
        return export_checkpoint(step, source, out)
    except (ModelNotFoundError, ModelLoadError, CheckpointLoadError) as err:
        raise ExportError(str(err)) from None
