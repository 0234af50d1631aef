"""A model folder's files as the run will read them, without loading anything: a config.json that
parses, weights whose safetensors headers are readable and whose files are as long as their headers
say (a truncated copy is caught here, not at load time), a complete sharded index. The preflight
(preflight/model_folders.py) and the loaders (models.py) both check with it."""

from __future__ import annotations

import json
import struct
from pathlib import Path

from dockyard.config.errors import Problem

_MAX_HEADER = 100 * 1024 * 1024


def safetensors_elements(path: Path) -> int:
    """Elements of every tensor in the file; ValueError says what is wrong with it."""
    size = path.stat().st_size
    with open(path, "rb") as handle:
        head = handle.read(8)
        if len(head) < 8:
            raise ValueError(f"{path}: not a safetensors file ({size} bytes)")
        length = struct.unpack("<Q", head)[0]
        if length > min(_MAX_HEADER, size - 8):
            raise ValueError(f"{path}: not a safetensors file, or truncated (header of {length} bytes in a file "
                             f"of {size})")
        try:
            header = json.loads(handle.read(length))
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise ValueError(f"{path}: the safetensors header is not valid JSON") from None
    end, elements = 0, 0
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        end = max(end, entry["data_offsets"][1])
        count = 1
        for dim in entry["shape"]:
            count *= dim
        elements += count
    if 8 + length + end > size:
        raise ValueError(f"{path}: truncated: its header describes {8 + length + end} bytes, the file has {size}")
    return elements


def missing_model_message(folder: Path) -> str:
    """Why there is no model at `folder`, and where one comes from: another dockyard run's exported
    weights (a recipe stage not run yet), or the tools that build the shipped models."""
    if folder.name == "hf" and folder.parent.name == "checkpoints":
        run = folder.parent.parent
        return (f"no model folder at {folder} (config.json missing): it is the exported model of the dockyard "
                f"run {run.name!r} ({run}), which has not finished yet; train that run first (the V4 recipe's "
                "stages: `python tools/v4_recipe.py --help`)")
    return (f"no model folder at {folder} (config.json missing). dockyard never downloads models: build the "
            "tiny test model with `python tools/make_tiny_model.py`, SmolLM2 with `python tools/smollm2_to_hf.py`, "
            "or point it at a local transformers folder")


def check_model_folder(field: str, path: str | None) -> tuple[list[Problem], int]:
    """Problems of one model folder, and its parameter count (0 when unknown)."""
    if not path:
        return [], 0
    folder = Path(path).expanduser()
    config = folder / "config.json"
    if not config.is_file():
        return [Problem(field, missing_model_message(folder))], 0
    try:
        json.loads(config.read_text())
    except json.JSONDecodeError as err:
        return [Problem(field, f"{config}: not valid JSON ({err.msg}, line {err.lineno} column {err.colno})")], 0
    except (OSError, UnicodeDecodeError) as err:
        return [Problem(field, f"{config}: cannot be read ({err})")], 0
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (json.JSONDecodeError, KeyError, AttributeError):
            return [Problem(field, f"{index}: not a safetensors index (no weight_map)")], 0
        files = [folder / shard for shard in shards]
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            return [Problem(field, f"{index} lists shards that are missing: {', '.join(missing)}")], 0
    else:
        files = sorted(folder.glob("*.safetensors"))
        if not files:
            if any(folder.glob("pytorch_model*.bin")):
                return [], 0
            return [Problem(field, f"{folder}: no weights (model.safetensors, a sharded index, or "
                            "pytorch_model.bin)")], 0
    problems, elements = [], 0
    for file in files:
        try:
            elements += safetensors_elements(file)
        except (ValueError, KeyError, TypeError, OSError) as err:
            problems.append(Problem(field, str(err)))
    return problems, elements


def folder_weights(folder: Path) -> dict:
    """Every tensor of a model folder's *.safetensors files (a sharded model's shards merged), as torch
    tensors; {} when it holds none."""
    from safetensors.torch import load_file

    weights = {}
    for path in sorted(Path(folder).glob("*.safetensors")):
        weights.update(load_file(str(path)))
    return weights
