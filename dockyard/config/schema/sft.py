"""`sft` (supervised fine-tuning)."""

from __future__ import annotations

from pydantic import NonNegativeInt, PositiveInt

from dockyard.config.fields import Section, field


class SFTConfig(Section):
    max_num_steps: PositiveInt = field(..., "Optimizer steps.")
    max_num_epochs: PositiveInt = field(1, "Passes over the data.")
    val_period: NonNegativeInt = field(0, "Validate every N steps; 0 disables it.", "> 0 needs data.validation.")
    loss_on_prompt: bool = field(False, "Also train on prompt tokens (otherwise loss_mask 0 there).")
    packing: bool = field(True, "Pack several conversations into one row of up to "
                          "policy.dynamic_batching.max_tokens_per_gpu tokens, each attending only to itself.",
                          "Needs policy.dynamic_batching.enabled and sdpa or eager attention.")
