"""Model, tokenizer and checkpoint folders as the run will read them: a config.json that parses,
weights whose safetensors headers are readable and whose files are as long as their headers say
(a truncated copy is caught here, not at load time), a complete sharded index, a tokenizer that loads
and a chat template that renders a message."""

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


def check_tokenizer(field: str, path: str, chat_template_file: str | None, needs_template: bool) -> list[Problem]:
    """The tokenizer loads and renders a user message through the chat template the run uses."""
    from dockyard.models import load_tokenizer

    try:
        tokenizer = load_tokenizer(path)
    except Exception as err:   # transformers raises many kinds; each names the file
        return [Problem(field, f"the tokenizer in {path} does not load: {type(err).__name__}: "
                        f"{str(err).splitlines()[0] if str(err) else ''}")]
    if not needs_template:
        return []
    template = None
    if chat_template_file:
        try:
            template = Path(chat_template_file).read_text()
        except OSError as err:
            return [Problem("policy.generation.chat_template.path", f"{chat_template_file}: cannot be read ({err})")]
    if template is None and not tokenizer.chat_template:
        return [Problem(field, f"the tokenizer in {path} has no chat template; set "
                        "policy.generation.chat_template.path")]
    try:
        tokenizer.apply_chat_template([{"role": "user", "content": "1+1?"}], chat_template=template,
                                      tokenize=False, add_generation_prompt=True)
    except Exception as err:   # a Jinja error names the template line
        where = chat_template_file or f"{path} (its chat template)"
        return [Problem("policy.generation.chat_template.path" if chat_template_file else field,
                        f"{where} does not render a user message: {type(err).__name__}: {err}")]
    return []


def check_tensor_parallel_plan(path: str, size: int) -> list[Problem]:
    """The model's architecture has a TP plan this backend applies, and its heads split over `size` ranks."""
    from transformers import AutoConfig

    from dockyard.policy.tensor_parallel import TensorParallelError, layer_plan

    try:
        layer_plan(AutoConfig.from_pretrained(path), size, path)
    except TensorParallelError as err:
        field, _, message = str(err).partition(": ")
        return [Problem(field, message)]
    except (OSError, ValueError) as err:   # config.json problems are reported by check_model_folder
        return [Problem("policy.model_name", f"{path}: its config does not load: {err}")]
    return []


def check_generation_tensor_parallel(field: str, path: str, size: int, note: str = "") -> list[Problem]:
    """A generation server's tensor-parallel `size` splits the model's attention heads as vLLM and
    SGLang require (heads divisible by it; key/value heads divisible by it, or it by them): refused
    here, not 25 s into the job when the server would not start."""
    if size <= 1:
        return []
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(path)
    except (OSError, ValueError):
        return []   # config.json problems are reported by check_model_folder
    config = getattr(config, "text_config", None) or config
    heads = getattr(config, "num_attention_heads", None)
    if not heads:
        return []
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    fits = heads % size == 0 and (kv_heads % size == 0 if kv_heads >= size else size % kv_heads == 0)
    if fits:
        return []
    sizes = [n for n in range(1, heads + 1) if heads % n == 0 and (kv_heads % n == 0 if kv_heads >= n else n % kv_heads == 0)]
    return [Problem(field, f"{size}{note} does not split {path}'s {heads} attention heads ({kv_heads} key/value heads) "
                           f"over its ranks; the server would not start. Sizes that do: {', '.join(map(str, sizes))}")]


def check_checkpoint_step(field: str, path: str) -> list[Problem]:
    from dockyard.models import ModelNotFoundError, checkpoint_weights_folder

    try:
        checkpoint_weights_folder(path)
    except ModelNotFoundError as err:
        return [Problem(field, str(err))]
    return []


def check_resume(checkpointing) -> list[Problem]:
    """resume_from: a given step is complete; auto: the pointer, if any, names a complete step."""
    if not checkpointing.enabled and checkpointing.resume_from in (None, "auto"):
        return []
    if checkpointing.resume_from is None:
        return []
    if checkpointing.resume_from != "auto":
        return check_checkpoint_step("checkpointing.resume_from", checkpointing.resume_from)
    pointer = Path(checkpointing.checkpoint_dir) / "latest_checkpointed_iteration.txt"
    if not pointer.is_file():
        return []
    step = pointer.read_text().strip()
    path = pointer.parent / f"step_{step}"
    problems = check_checkpoint_step("checkpointing.checkpoint_dir", str(path))
    return [Problem(p.path, f"{pointer} names step {step} (the run would resume from it): {p.message}")
            for p in problems]
