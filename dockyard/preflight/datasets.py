"""Datasets as the run will read them: every file exists and parses, the configured columns are
there, row slices are in range, generators build, and an SFT dataset's first conversations render
through the chat template with an assistant reply to train on."""

from __future__ import annotations

from dockyard.config.errors import Problem
from dockyard.config.schema import MasterConfig

SFT_ROWS_CHECKED = 20


def dataset_fields(cfg: MasterConfig) -> list[tuple[str, object]]:
    fields = [(f"data.datasets[{i}]", dataset) for i, dataset in enumerate(cfg.data.datasets)]
    if cfg.data.validation is not None:
        fields.append(("data.validation", cfg.data.validation))
    return fields


def check_datasets(cfg: MasterConfig) -> tuple[list[Problem], list[str]]:
    """Problems, and a note when grpo.max_num_epochs ends the run before max_num_steps."""
    from dockyard.data.datasets import DatasetError, load_prompts

    problems, rows = [], {}
    for field, dataset in dataset_fields(cfg):
        where = f"{field}.{'path' if dataset.path is not None else 'generator'}"
        try:
            prompts = load_prompts(dataset)
        except DatasetError as err:
            problems.append(Problem(where, str(err)))
            continue
        rows[field] = len(prompts)
        if cfg.sft is not None:
            problems += _conversations(cfg, field, dataset, prompts)
    notes = [] if problems or cfg.sft is not None else _epochs_end_the_run(cfg, rows)
    return problems, notes


def _epochs_end_the_run(cfg: MasterConfig, rows: dict[str, int]) -> list[str]:
    """Each training dataset gets its weight's share of the step's prompts; the run ends once the slowest
    one has been drawn max_num_epochs times (oversampling and dynamic sampling draw more, so sooner)."""
    import math

    grpo, datasets = cfg.grpo, cfg.data.datasets
    total_weight = sum(d.weight for d in datasets)
    steps = max(math.ceil(grpo.max_num_epochs * rows[f"data.datasets[{i}]"]
                          / (grpo.num_prompts_per_step * d.weight / total_weight)) for i, d in enumerate(datasets))
    if steps >= grpo.max_num_steps:
        return []
    count = sum(rows[f"data.datasets[{i}]"] for i in range(len(datasets)))
    return [f"grpo.max_num_epochs={grpo.max_num_epochs} ends the run after about step {steps} of "
            f"grpo.max_num_steps={grpo.max_num_steps} ({count} training rows, {grpo.num_prompts_per_step} prompts "
            "a step); raise max_num_epochs to train longer"]


def _conversations(cfg: MasterConfig, field: str, dataset, prompts) -> list[Problem]:
    from dockyard.data.conversations import conversation_tokens
    from dockyard.data.datasets import DatasetError
    from dockyard.models import ModelNotFoundError, load_tokenizer

    try:
        tokenizer = load_tokenizer(cfg.policy.tokenizer_name or cfg.policy.model_name)
    except (ModelNotFoundError, OSError, ValueError):
        return []   # named by the model check
    chat = cfg.policy.generation.chat_template
    try:
        template = open(chat.path).read() if chat.path else None
    except OSError:
        return []   # named by the tokenizer check
    for index, prompt in enumerate(prompts[:SFT_ROWS_CHECKED]):
        try:
            conversation_tokens(tokenizer, prompt.input, template, chat.generation_prompt_kwargs,
                                where=f"dataset {dataset.name!r} row {index}")
        except DatasetError as err:
            return [Problem(f"{field}.path", str(err))]
    return []
