"""Output folders: the checkpoint and log folders can be created and written, and the disk holding
the checkpoints has room for the checkpoints the run keeps at once."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from dockyard.config.errors import Problem
from dockyard.config.schema import MasterConfig

# per parameter: fp32 master weights + AdamW's two fp32 moments (the DCP step), + an fp32 HF export
STATE_BYTES, OPTIMIZER_BYTES, HF_BYTES = 4, 8, 4


def _existing_ancestor(path: Path) -> Path:
    path = path.absolute()
    while not path.exists():
        path = path.parent
    return path


def _writable(field: str, folder: str) -> list[Problem]:
    path = Path(folder).expanduser()
    if path.exists() and not path.is_dir():
        return [Problem(field, f"{path} exists and is not a folder")]
    base = _existing_ancestor(path)
    if not base.is_dir() or not os.access(base, os.W_OK | os.X_OK):
        return [Problem(field, f"{path} cannot be written: {base} is not a writable folder")]
    return []


def size(count: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if count < 1024 or unit == "GiB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    return f"{count:.1f} TiB"


def checkpoint_bytes(cfg: MasterConfig, parameters: int) -> int:
    ckpt = cfg.checkpointing
    per_parameter = ((STATE_BYTES if ckpt.save_state else 0)
                     + (OPTIMIZER_BYTES if ckpt.save_state and ckpt.save_optimizer else 0)
                     + (HF_BYTES if ckpt.export_hf else 0))
    return parameters * per_parameter


def kept_checkpoints(cfg: MasterConfig) -> int | None:
    """How many checkpoints exist at once (the one being written before older ones are removed); None
    when the run keeps every one."""
    ckpt = cfg.checkpointing
    if not ckpt.keep_last and ckpt.keep_top_k is None:
        return None
    return max(1, ckpt.keep_last) + (ckpt.keep_top_k or 0) + 1


def check_outputs(cfg: MasterConfig, parameters: int) -> tuple[list[Problem], list[str]]:
    """Problems, and notes of what was not checked."""
    problems = _writable("logger.log_dir", cfg.logger.log_dir)
    notes = []
    if not cfg.checkpointing.enabled:
        return problems, notes
    problems += _writable("checkpointing.checkpoint_dir", cfg.checkpointing.checkpoint_dir)
    if problems or not parameters:
        if not parameters:
            notes.append("checkpoint disk space: the policy's size is unknown (no safetensors weights)")
        return problems, notes
    one = checkpoint_bytes(cfg, parameters)
    count = kept_checkpoints(cfg)
    need = one * (count or 1)
    free = shutil.disk_usage(_existing_ancestor(Path(cfg.checkpointing.checkpoint_dir))).free
    if free < need:
        kept = f"{count} kept at once (keep_last, keep_top_k, and the one being written)" if count else "one"
        problems.append(Problem("checkpointing.checkpoint_dir", f"{size(free)} free on its disk, but a checkpoint "
                                f"of this policy takes about {size(one)} and the run needs {kept}: {size(need)}"))
    elif count is None:
        notes.append(f"checkpoint disk space: keep_last=0 keeps every checkpoint ({size(one)} each); "
                     f"{size(free)} free holds {int(free // max(one, 1))}")
    return problems, notes
