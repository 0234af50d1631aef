"""Checkpoints: complete or absent.

Layout under `checkpointing.checkpoint_dir`:

    step_4/                          one complete checkpoint
      dcp/                           with save_state: torch.distributed.checkpoint model shards, and the
                                     optimizer's with save_optimizer
      rng_rank<r>.pt                 each rank's RNG states
      trainer_state.json             step, scheduler, data position, metric, and what the step holds
      hf/                            with checkpointing.export_hf: the weights as an HF folder
    latest_checkpointed_iteration.txt   "4": the newest complete checkpoint
    hf -> step_4/hf                  with export_hf: the newest step's HF folder (hf_export.py)

A save writes `step_N.tmp/`, fsyncs every file, renames it to `step_N` and only then rewrites the
pointer (itself via a temporary file and rename). A crash at any moment leaves the previous
checkpoint and a pointer to a complete one.

Every step can be resumed from. A step without dcp/ (save_state: false) resumes from its HF weights,
which are the float32 master weights exactly; one without the optimizer's shards (save_optimizer:
false, or save_state: false) restarts the optimizer's moments, and resume says so.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from dockyard.config.schema.checkpointing import CheckpointingConfig
from dockyard.errors import DockyardError
from dockyard.io.hf_folders import point_latest, write_hf_folder

POINTER = "latest_checkpointed_iteration.txt"


def _fsync_tree(folder: Path) -> None:
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            with open(path, "rb") as handle:
                os.fsync(handle.fileno())
    for path in [folder, *sorted(p for p in folder.rglob("*") if p.is_dir())]:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def rng_state() -> dict[str, Any]:
    return {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])


class CheckpointLoadError(DockyardError, RuntimeError):
    label = "checkpoint error"


def load_model_weights(path: str | Path, model: torch.nn.Module) -> None:
    """Only the model weights of a dockyard checkpoint (every rank calls it): a reference policy from a
    saved step. Fails with the reason when the checkpoint does not hold this model's weights."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

    from dockyard.models import checkpoint_weights_folder

    folder = checkpoint_weights_folder(path)
    state_file = folder / "trainer_state.json"
    adapters_only = state_file.is_file() and contents(json.loads(state_file.read_text()))["adapters_only"]
    if adapters_only and not (folder / "hf" / "model.safetensors").is_file():
        raise CheckpointLoadError(f"{folder} holds LoRA adapters only, not the model's weights (a LoRA run with "
                                  "checkpointing.export_hf writes them merged at save time)")
    megatron = state_file.is_file() and contents(json.loads(state_file.read_text()))["format"] != "dcp"
    if megatron and not (folder / "hf" / "model.safetensors").is_file():
        raise CheckpointLoadError(f"{folder} holds a megatron dist checkpoint without an HF export; the dtensor "
                                  "backend and `dockyard export` read its hf/ folder (checkpointing.export_hf: true)")
    if adapters_only or not (folder / "dcp" / ".metadata").is_file():
        _load_hf_weights(folder / "hf", model)
        return
    state = {"model": get_model_state_dict(model)}
    try:
        dcp.load(state, checkpoint_id=str(folder / "dcp"))
    except (Exception, CheckpointException) as err:  # DCP's per-rank failures are BaseExceptions
        lines = [line.strip() for line in str(err).strip().splitlines() if line.strip()]
        raise CheckpointLoadError(f"{folder} does not hold this model's weights: "
                                  f"{lines[-1][:600] if lines else type(err).__name__}") from None
    set_model_state_dict(model, state["model"])


def _load_hf_weights(folder: Path, model: torch.nn.Module) -> None:
    """The weights of an HF export (every rank calls it; rank 0 reads the file and broadcasts it). A
    problem rank 0 finds is shared first, so every rank raises it instead of waiting in the broadcast."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    distributed = dist.is_initialized()
    weights: dict[str, torch.Tensor] = {}
    problem = None
    if not distributed or dist.get_rank() == 0:
        try:
            weights = load_file(str(folder / "model.safetensors"))
        except (OSError, SafetensorError) as err:
            problem = f"{folder / 'model.safetensors'} cannot be read: {err}"
        else:
            names = {n for n, _ in model.named_parameters()} | {n for n, _ in model.named_buffers()}
            missing = sorted(names - set(weights) - _non_persistent_buffers(model))
            unexpected = sorted(set(weights) - set(model.state_dict()))
            if missing or unexpected:
                problem = (f"{folder} does not hold this model's weights: " + "; ".join(filter(None, [
                    f"missing {', '.join(missing[:5])}" if missing else "",
                    f"unexpected {', '.join(unexpected[:5])}" if unexpected else ""])))
    if distributed:
        box = [problem]
        dist.broadcast_object_list(box, src=0)
        problem = box[0]
    if problem is not None:
        raise CheckpointLoadError(problem)
    set_model_state_dict(model, weights, options=StateDictOptions(
        full_state_dict=True, broadcast_from_rank0=distributed, strict=False))


def _trained_only(model: torch.nn.Module):
    """State-dict options: a model with frozen weights (LoRA) saves and loads only what it trains; the
    rest comes from its model folder at start."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    frozen = any(not p.requires_grad for p in model.parameters())
    # strict=False: the frozen weights are not in the state dict by design; DCP itself fails on a
    # trained weight the checkpoint lacks
    return StateDictOptions(ignore_frozen_params=frozen, strict=not frozen)


def _non_persistent_buffers(model: torch.nn.Module) -> set[str]:
    return {f"{prefix}.{name}" if prefix else name for prefix, module in model.named_modules()
            for name in module._non_persistent_buffers_set}


def contents(trainer_state: dict[str, Any]) -> dict[str, bool]:
    """What a step holds (steps written before this record held DCP weights and optimizer, no HF folder)."""
    return {"dcp": True, "optimizer": True, "hf": False, "model": None, "adapters_only": False, "format": "dcp",
            **trainer_state.get("contents", {})}


def step_contents(folder: Path) -> dict[str, Any]:
    """What the step folder `folder` holds, from its trainer_state.json."""
    return contents(json.loads((folder / "trainer_state.json").read_text()))


class CheckpointState(Protocol):
    """What a policy backend saves in a step folder and loads from it (CheckpointManager keeps the
    folder complete-or-absent, the pointer, the RNG and the loop's state)."""

    format: str            # what the state is written as ("dcp", "megatron_dist_ckpt"); recorded per step
    adapters_only: bool    # only LoRA adapters are trained (the rest comes from the model folder)

    def save(self, folder: Path, with_optimizer: bool) -> None: ...
    def load(self, folder: Path, held: dict[str, Any]) -> None: ...
    def hf_weights(self) -> dict[str, torch.Tensor]: ...
    def scheduler_state(self) -> dict[str, Any] | None: ...
    def load_scheduler_state(self, state: dict[str, Any]) -> None: ...


class TorchModuleState:
    """A torch module (plain or FSDP2-sharded), its optimizer and scheduler, saved with
    torch.distributed.checkpoint under dcp/."""

    format = "dcp"

    def __init__(self, model: torch.nn.Module, optimizer=None, scheduler=None):
        self.model, self.optimizer, self.scheduler = model, optimizer, scheduler
        self.adapters_only = _trained_only(model).ignore_frozen_params

    def save(self, folder: Path, with_optimizer: bool) -> None:
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        options = _trained_only(self.model)
        if with_optimizer and self.optimizer is not None:
            model_state, optim_state = get_state_dict(self.model, self.optimizer, options=options)
            state = {"model": model_state, "optim": optim_state}
        else:
            state = {"model": get_model_state_dict(self.model, options=options)}
        dcp.save(state, checkpoint_id=str(folder / "dcp"))

    def load(self, folder: Path, held: dict[str, Any]) -> None:
        from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

        options = _trained_only(self.model)
        if held["dcp"] and held["optimizer"] and self.optimizer is not None:
            model_state, optim_state = get_state_dict(self.model, self.optimizer, options=options)
            state = {"model": model_state, "optim": optim_state}
            dcp.load(state, checkpoint_id=str(folder / "dcp"))
            set_state_dict(self.model, self.optimizer, model_state_dict=state["model"],
                           optim_state_dict=state["optim"], options=options)
        elif held["dcp"]:
            state = {"model": get_model_state_dict(self.model, options=options)}
            dcp.load(state, checkpoint_id=str(folder / "dcp"))
            set_model_state_dict(self.model, state["model"], options=options)
        else:
            _load_hf_weights(folder / "hf", self.model)

    def hf_weights(self) -> dict[str, torch.Tensor]:
        """Full weights under the model's names on rank 0 (every rank takes part), tied aliases left out;
        a LoRA model's are base + adapters under the base model's names."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        from dockyard.policy.lora import merged_weights

        weights = get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if dist.is_initialized() and dist.get_rank() != 0:
            return {}
        tied = set(weights) - {n for n, _ in self.model.named_parameters()} - {n for n, _ in self.model.named_buffers()}
        return {name: tensor for name, tensor in merged_weights(self.model, weights).items() if name not in tied}

    def scheduler_state(self) -> dict[str, Any] | None:
        return self.scheduler.state_dict() if self.scheduler is not None else None

    def load_scheduler_state(self, state: dict[str, Any]) -> None:
        if self.scheduler is not None:
            self.scheduler.load_state_dict(state)


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


class CheckpointManager:
    def __init__(self, config: CheckpointingConfig, rank: int, hf_source: str | None = None):
        """`hf_source`: the model folder whose config and tokenizer go with an HF export (export_hf)."""
        self.config, self.rank, self.hf_source = config, rank, hf_source
        self.root = Path(config.checkpoint_dir)

    # --- reading ------------------------------------------------------------------------------

    def latest(self) -> Path | None:
        """The checkpoint to resume from: resume_from (a path) or the pointer's, when complete."""
        if self.config.resume_from is None:
            return None
        if self.config.resume_from != "auto":
            path = Path(self.config.resume_from)
            if not (path / "trainer_state.json").is_file():
                raise FileNotFoundError(f"checkpointing.resume_from: {path} is not a complete dockyard checkpoint "
                                        "(no trainer_state.json)")
            return path
        pointer = self.root / POINTER
        if not pointer.is_file():
            return None
        step = pointer.read_text().strip()
        path = self.root / f"step_{step}"
        if not (path / "trainer_state.json").is_file():
            raise FileNotFoundError(f"{pointer} names step {step}, but {path} is not a complete checkpoint")
        return path

    def latest_step(self) -> int | None:
        pointer = self.root / POINTER
        return int(pointer.read_text().strip()) if pointer.is_file() else None

    def load(self, path: Path, state: "CheckpointState") -> dict[str, Any]:
        """The training state of step folder `path` into `state` (a policy's checkpoint_state()); the
        returned trainer state's "not_restored" lists what the step did not hold."""
        trainer_state = json.loads((path / "trainer_state.json").read_text())
        held = contents(trainer_state)
        if held["dcp"] and held["format"] != state.format:
            raise CheckpointLoadError(f"{path} holds {held['format']} training state, and this run's policy backend "
                                      f"saves and loads {state.format}; start a new checkpoint_dir from its HF "
                                      "export (checkpointing.export_hf, `dockyard export`) as policy.model_name")
        state.load(path, held)
        trainer_state["not_restored"] = [] if held["optimizer"] else [
            "the optimizer state (saved with " + ("save_optimizer: false" if held["dcp"] else "save_state: false")
            + "): its moments restart from zero"]
        if trainer_state.get("scheduler") is not None:
            state.load_scheduler_state(trainer_state["scheduler"])
        rng_file = path / f"rng_rank{self.rank}.pt"
        if rng_file.is_file():
            set_rng_state(torch.load(rng_file, weights_only=False))
        return trainer_state

    # --- writing ------------------------------------------------------------------------------

    def save(self, step: int, state: "CheckpointState", trainer_state: dict[str, Any]) -> Path:
        """Step `step` of `state` (a policy's checkpoint_state()) with the loop's `trainer_state`."""
        final = self.root / f"step_{step}"
        tmp = self.root / f"step_{step}.tmp"
        _barrier()
        if (final / "trainer_state.json").is_file():
            # this step is already saved (a rerun after a resume, or a stop right after a periodic save);
            # replacing it would open a moment in which the pointer names a missing folder
            if self.rank == 0:
                _write_atomic(self.root / POINTER, f"{step}\n")
            _barrier()
            return final
        if self.rank == 0:
            self.root.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(tmp, ignore_errors=True)  # leftovers of a save that was killed
            tmp.mkdir()
        _barrier()
        if self.config.save_state:
            state.save(tmp, with_optimizer=self.config.save_optimizer)
        torch.save(rng_state(), tmp / f"rng_rank{self.rank}.pt")
        if self.config.export_hf:
            self._export_hf(state, tmp / "hf")
        _barrier()
        if self.rank == 0:
            held = {"dcp": self.config.save_state, "optimizer": self.config.save_state and self.config.save_optimizer,
                    "hf": self.config.export_hf, "model": str(Path(self.hf_source).resolve()) if self.hf_source else None,
                    "adapters_only": state.adapters_only, "format": state.format}
            record = dict(trainer_state, step=step, scheduler=state.scheduler_state(), contents=held)
            (tmp / "trainer_state.json").write_text(json.dumps(record, indent=2, default=float))
            _fsync_tree(tmp)
            shutil.rmtree(final, ignore_errors=True)  # an incomplete leftover (no trainer_state.json)
            os.replace(tmp, final)
            _write_atomic(self.root / POINTER, f"{step}\n")
            if self.config.export_hf:
                point_latest(self.root, final / "hf")
            self._apply_retention(step)
        _barrier()
        return final

    def _export_hf(self, state: "CheckpointState", out: Path) -> None:
        """Every rank takes part in gathering the full weights; rank 0 writes them."""
        if self.hf_source is None:
            raise ValueError("checkpointing.export_hf needs the model folder the run started from")
        weights = state.hf_weights()
        if self.rank == 0:
            write_hf_folder(weights, self.hf_source, out)

    def _apply_retention(self, newest: int) -> None:
        steps = sorted(int(p.name.removeprefix("step_")) for p in self.root.glob("step_*")
                       if p.is_dir() and p.name.removeprefix("step_").isdigit())
        if not self.config.keep_last and self.config.keep_top_k is None:
            return  # keep every checkpoint
        keep = set(steps[-self.config.keep_last:]) if self.config.keep_last else set()
        keep.add(newest)
        if self.config.keep_top_k is not None and self.config.metric_name:
            scored = []
            for step in steps:
                state = json.loads((self.root / f"step_{step}" / "trainer_state.json").read_text())
                value = state.get("metrics", {}).get(self.config.metric_name)
                if value is not None:
                    scored.append((value, step))
            scored.sort(reverse=self.config.higher_is_better)
            keep |= {step for _, step in scored[:self.config.keep_top_k]}
        for step in steps:
            if step not in keep:
                shutil.rmtree(self.root / f"step_{step}", ignore_errors=True)
