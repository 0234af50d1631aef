"""Loading models and tokenizers from local folders only (no hub access at run time)."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from dockyard.errors import DockyardError
from dockyard.model_files import check_model_folder, missing_model_message

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


class ModelNotFoundError(DockyardError, FileNotFoundError):
    label = "model error"


class ModelLoadError(DockyardError, RuntimeError):
    """A model folder that is there but cannot be loaded (changed since the preflight, e.g. between a
    submit and a requeued restart): the message names the file."""
    label = "model error"


def readable_model_folder(path: str | Path) -> Path:
    """The folder, once its config, weights and their headers pass the preflight's checks."""
    folder = model_folder(path)
    problems, _ = check_model_folder("", str(folder))
    if problems:
        raise ModelLoadError("; ".join(problem.message for problem in problems))
    return folder


def _load(what: str, loader, folder: Path):
    try:
        return loader(folder)
    except Exception as err:   # transformers raises many kinds; the run needs one named error
        first = str(err).strip().splitlines()[0] if str(err).strip() else ""
        raise ModelLoadError(f"{folder}: the {what} cannot be loaded: {type(err).__name__}: {first}") from None


def model_folder(path: str | Path) -> Path:
    folder = Path(path).expanduser()
    if not (folder / "config.json").is_file():
        raise ModelNotFoundError(missing_model_message(folder))
    return folder


def checkpoint_weights_folder(path: str | Path) -> Path:
    """A dockyard checkpoint used as model weights: one concrete, complete step folder (<run>/step_<N>)."""
    folder = Path(path).expanduser()
    if not folder.is_dir():
        raise ModelNotFoundError(f"no checkpoint folder at {folder}")
    if (folder / "latest_checkpointed_iteration.txt").is_file():
        raise ModelNotFoundError(f"{folder} is a checkpoint_dir (it holds latest_checkpointed_iteration.txt); "
                                 "name one step folder inside it, e.g. " + str(folder / "step_<N>"))
    weights = any((folder / name).is_file() for name in ("dcp/.metadata", "dist_ckpt/metadata.json",
                                                          "orbax/params/_CHECKPOINT_METADATA", "hf/model.safetensors"))
    if not (folder / "trainer_state.json").is_file() or not weights:
        raise ModelNotFoundError(f"{folder} is not a complete dockyard checkpoint (needs trainer_state.json "
                                 "and dcp/.metadata (dtensor), dist_ckpt/metadata.json (megatron) or "
                                 "orbax/params/_CHECKPOINT_METADATA (jax), or "
                                 "hf/model.safetensors from a save_state: false run)")
    return folder


def _quiet_transformers() -> None:
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()


def load_causal_lm(path: str | Path, dtype: torch.dtype = torch.float32):
    """The folder's language model; a vision-language model (a vision_config in its config) loads with
    its vision tower, as image-text-to-text."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    from dockyard.vision import is_vision_model

    _quiet_transformers()
    auto = AutoModelForImageTextToText if is_vision_model(path) else AutoModelForCausalLM
    return _load("model", lambda folder: auto.from_pretrained(folder, dtype=dtype), readable_model_folder(path))


def load_tokenizer(path: str | Path):
    from transformers import AutoTokenizer

    _quiet_transformers()
    return _load("tokenizer", AutoTokenizer.from_pretrained, model_folder(path))


def save_model_folder(model, tokenizer, out: str | Path) -> Path:
    """Write a transformers folder next to `out` and rename it into place, so a half-written folder
    is never mistaken for a model."""
    out = Path(out)
    tmp = out.with_name(out.name + ".tmp")
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    tmp.rename(out)
    return out
