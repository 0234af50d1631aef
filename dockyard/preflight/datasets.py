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


def check_datasets(cfg: MasterConfig) -> list[Problem]:
    from dockyard.data.datasets import DatasetError, load_prompts

    problems = []
    for field, dataset in dataset_fields(cfg):
        where = f"{field}.{'path' if dataset.path is not None else 'generator'}"
        try:
            prompts = load_prompts(dataset)
        except DatasetError as err:
            problems.append(Problem(where, str(err)))
            continue
        if cfg.sft is not None:
            problems += _conversations(cfg, field, dataset, prompts)
    return problems


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
