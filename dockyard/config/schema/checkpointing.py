"""`checkpointing`: save cadence, retention and resume."""

from __future__ import annotations

from typing import Optional

from pydantic import NonNegativeInt

from dockyard.config.fields import Section, field


class CheckpointingConfig(Section):
    enabled: bool = field(True, "Save checkpoints.")
    checkpoint_dir: str = field(..., "Base folder of step_<N> checkpoints and "
                                "latest_checkpointed_iteration.txt; also where resume looks.")
    save_period: int = field(10, "Save every N steps; <= 0 saves only at the end and on preemption.")
    keep_top_k: Optional[NonNegativeInt] = field(None, "Also keep the k best checkpoints by metric_name; "
                                                 "null ranks none.", "Needs metric_name.")
    keep_last: NonNegativeInt = field(2, "Keep the most recent N checkpoints (resume points); others are deleted "
                                      "unless among the top k. 0 with keep_top_k null keeps every checkpoint.")
    metric_name: Optional[str] = field(None, "Metric ranking checkpoints for keep_top_k (e.g. val_reward).")
    higher_is_better: bool = field(True, "Direction of metric_name.")
    save_state: bool = field(True, "Write the sharded training state (torch.distributed.checkpoint: weights and, "
                             "with save_optimizer, the optimizer) to step_<N>/dcp. false keeps only the HF folder; "
                             "resume then loads the weights from it and restarts the optimizer, and says so. "
                             "Scheduler, data position and RNG are always saved (they are small).",
                             "With enabled, at least one of save_state / export_hf must be true.")
    save_optimizer: bool = field(True, "Include the optimizer state (needed for exact resume; about 2/3 of a "
                                 "checkpoint with AdamW). false: resume restarts the optimizer's moments and says so.")
    export_hf: bool = field(False, "Also write the weights as a Hugging Face folder to step_<N>/hf (model.safetensors "
                            "in float32, config, tokenizer, generation config); <checkpoint_dir>/hf names the "
                            "newest. `dockyard export hf` converts any saved step afterwards.")
    resume_from: Optional[str] = field("auto", "auto resumes from the latest complete checkpoint in "
                                       "checkpoint_dir; a path resumes from that checkpoint; null starts fresh.")
