"""`data`: the training datasets (one or several), the validation split and prompt filters."""

from __future__ import annotations

from typing import Optional

from pydantic import PositiveInt, model_validator

from dockyard.config.fields import OpenSection, Section, component, field


class GeneratorSource(OpenSection):
    """A procedural task source; extra keys are passed to the generator."""

    name: str = field(..., "Generator name (reasoning-gym task: basic_arithmetic, chain_sum, gsm_symbolic, ...).")
    size: PositiveInt = field(1000, "Rows to serve (a generated row with a wrong answer is replaced by the next).")
    seed: int = field(0, "Generator seed.")


class DatasetConfig(Section):
    name: str = field("train", "Label used in logs and metrics.")
    path: Optional[str] = field(None, "A .jsonl, .parquet or .csv file, with an optional row slice: data.jsonl@[0:1000].",
                                "Exactly one of path / generator.")
    generator: Optional[GeneratorSource] = field(None, "Generate rows instead of reading a file.")
    input_key: str = field("input", "Column with the prompt text or message list.")
    label_key: Optional[str] = field("label", "Column with the ground truth; null if unused.")
    metadata_key: Optional[str] = field("metadata", "Column with a per-row dict handed to the environment "
                                        "unchanged; null hands it the whole row (flat task rows such as SWE-bench's).")
    max_prompt_chars: Optional[PositiveInt] = field(None, "Drop rows whose prompt is longer (characters, "
                                                    "not tokens); null disables the filter.")
    shuffle: bool = field(True, "Shuffle this dataset with policy.seed.")
    data_pre_processor: Optional[component("data_pre_processor")] = field(
        None, "Raw-row pre-processor (see `dockyard list`).")
    buffer_replay_strategy: Optional[component("buffer_replay_strategy")] = field(
        None, "Order of buffered groups in dynamic sampling; null means fifo.", "Not built: the loops carry no "
        "buffer between steps; a value is refused.")
    num_prompts_per_step: Optional[PositiveInt] = field(
        None, "This dataset's share of grpo.num_prompts_per_step; null splits it by weight.",
        "When set on every dataset, the shares must sum to grpo.num_prompts_per_step.")
    weight: float = field(1.0, "Sampling weight when shares are not given.", gt=0)
    teacher_name: str = field("", "OPD teacher scoring this dataset's rollouts; empty means none.",
                              "Must name one of on_policy_distillation.teachers.")

    @model_validator(mode="after")
    def _one_source(self) -> "DatasetConfig":
        if (self.path is None) == (self.generator is None):
            raise ValueError("set exactly one of 'path' (a .jsonl/.parquet file) or 'generator'")
        return self


class ValidationConfig(DatasetConfig):
    """The validation split is read whole and in order: the settings that say how a training dataset is
    drawn from (shuffle, num_prompts_per_step, weight, teacher_name) must stay at these defaults."""

    shuffle: bool = field(False, "Validation is read in order.", "Must be false.")


class DataConfig(Section):
    datasets: list[DatasetConfig] = field(..., "Training datasets; several are mixed.", "At least one.",
                                          min_length=1)
    validation: Optional[ValidationConfig] = field(None, "Validation dataset; null disables validation.")
    max_input_seq_length: Optional[PositiveInt] = field(
        None, "Skip training and validation prompts longer than this many tokens (as the chat template renders "
        "them, without an agent's tool preamble); null skips those that leave no room to generate within "
        "policy.max_total_sequence_length. The first few skipped are printed.", "Not for sft.")
    add_system_prompt: Optional[str] = field(None, "System message prepended to every prompt.")
