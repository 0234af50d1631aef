"""The optimizer's settings."""

from __future__ import annotations

from typing import Iterator

from dockyard.config.constraints.registry import rule
from dockyard.config.errors import Problem
from dockyard.config.schema import MasterConfig


@rule
def adam_settings_need_adam(cfg: MasterConfig) -> Iterator[Problem]:
    """betas and eps belong to AdamW; with sgd they would be ignored."""
    opt = cfg.policy.optimizer
    if opt.name == "sgd":
        defaults = type(opt).model_fields
        for name in ("betas", "eps"):
            if getattr(opt, name) != defaults[name].default:
                yield Problem(f"policy.optimizer.{name}", "an AdamW setting; policy.optimizer.name is sgd, which has "
                              "none: remove it or use adamw")
