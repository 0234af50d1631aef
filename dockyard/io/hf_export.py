"""`dockyard export hf` and a teacher from a saved step: the Hugging Face folder of a dockyard
checkpoint, what the next stage of a recipe (a teacher, a GRPO run from an SFT checkpoint) and other
tools load.

    step_<N>/hf/                 written at save time with checkpointing.export_hf (io/hf_folders.py)
    <checkpoint_dir>/hf          a link to the newest step's hf folder (what configs name)
    anywhere                     `dockyard export hf --checkpoint STEP|CHECKPOINT_DIR --out DIR` afterwards
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from dockyard.errors import DockyardError
from dockyard.io.checkpoint import POINTER, CheckpointLoadError, contents, load_model_weights
from dockyard.io.hf_folders import write_hf_folder
from dockyard.models import ModelLoadError, ModelNotFoundError, load_causal_lm


def export_checkpoint(step_folder: str | Path, source: str | Path, out: str | Path) -> Path:
    """An HF folder from a saved dockyard step (model weights of its DCP checkpoint); `source` is the
    model folder that gives the structure and the tokenizer (the run's policy.model_name)."""
    model = load_causal_lm(source, dtype=torch.float32)
    load_model_weights(step_folder, model)
    tied = set(model.state_dict()) - {n for n, _ in model.named_parameters()} - {n for n, _ in model.named_buffers()}
    return write_hf_folder(model.state_dict(), source, out, skip=tied)


class ExportError(DockyardError, RuntimeError):
    """A checkpoint that cannot be exported, with the reason (the CLI prints it without a traceback)."""


def step_folder_of(checkpoint: str | Path) -> Path:
    """A step folder, or a checkpoint_dir's newest complete step (its pointer)."""
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
