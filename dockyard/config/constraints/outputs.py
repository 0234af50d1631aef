"""What a run saves, validates and logs."""

from __future__ import annotations

import os

from typing import Iterator

from dockyard.config.constraints.registry import rule
from dockyard.config.errors import Problem
from dockyard.config.schema import MasterConfig


@rule
def saving(cfg: MasterConfig) -> Iterator[Problem]:
    """Enabled checkpointing writes something (save_state or export_hf); keep_top_k needs metric_name."""
    ckpt = cfg.checkpointing
    if ckpt.enabled and not (ckpt.save_state or ckpt.export_hf):
        yield Problem("checkpointing.save_state", "checkpointing is enabled but save_state and export_hf are "
                      "both false, so nothing would be written; set one (or enabled: false)")
    if ckpt.keep_top_k is not None and not ckpt.metric_name:
        yield Problem("checkpointing.metric_name", "keep_top_k ranks checkpoints by a metric; set metric_name")


@rule
def evaluation(cfg: MasterConfig) -> Iterator[Problem]:
    """Validation cadence (grpo.val_period, grpo.val_at_start, sft.val_period) needs data.validation."""
    if cfg.data.validation is not None:
        return
    if cfg.grpo.val_period > 0:
        yield Problem("grpo.val_period", f"validation every {cfg.grpo.val_period} steps needs data.validation")
    if cfg.grpo.val_at_start:
        yield Problem("grpo.val_at_start", "validation at start needs data.validation")
    if cfg.sft is not None and cfg.sft.val_period > 0:
        yield Problem("sft.val_period", f"validation every {cfg.sft.val_period} steps needs data.validation")


@rule
def tracking(cfg: MasterConfig) -> Iterator[Problem]:
    """MLflow logging needs logger.mlflow.tracking_uri."""
    if cfg.logger.mlflow_enabled and not cfg.logger.mlflow.tracking_uri and not os.environ.get("MLFLOW_TRACKING_URI"):
        yield Problem("logger.mlflow.tracking_uri", "required when logger.mlflow_enabled is true (or set "
                      "MLFLOW_TRACKING_URI)")


@rule
def validation_is_not_drawn_from(cfg: MasterConfig) -> Iterator[Problem]:
    """data.validation is read whole and in order: shuffle, num_prompts_per_step, weight and teacher_name
    (how a training dataset is drawn from) stay at their defaults."""
    validation = cfg.data.validation
    if validation is None:
        return
    for name, default, why in (("shuffle", False, "validation is read in order"),
                               ("num_prompts_per_step", None, "validation is read whole, not drawn per step"),
                               ("weight", 1.0, "validation is not mixed with other datasets"),
                               ("teacher_name", "", "validation is scored by the environment, not by a teacher")):
        if getattr(validation, name) != default:
            yield Problem(f"data.validation.{name}", f"{why}; remove the setting (it would have no effect)")
