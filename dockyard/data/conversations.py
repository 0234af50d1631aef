"""Chat conversations as training tokens for SFT: the chat template's rendering, tokenized once, with
a loss mask of 1 on the assistant's tokens only.

Which characters an assistant wrote is found from the template itself: the conversation up to that
reply rendered with the generation prompt is a prefix of the whole rendering, and so is the
conversation through the reply; the characters between the two are the reply (its end-of-turn
token included, so the model learns to stop). A template for which those are not prefixes (one
that rewrites earlier turns) is refused, naming the row, rather than masked wrongly.
"""

from __future__ import annotations

from typing import Any

from dockyard.data.datasets import DatasetError


def trailing_assistant_removed(messages: list[dict]) -> list[dict]:
    """The prompt of a conversation: every message before its last assistant reply."""
    for index in range(len(messages) - 1, -1, -1):
        if messages[index].get("role") == "assistant":
            return list(messages[:index])
    return list(messages)


def conversation_tokens(tokenizer, messages: Any, chat_template: str | None = None,
                        template_kwargs: dict | None = None, loss_on_prompt: bool = False,
                        where: str = "a conversation") -> tuple[list[int], list[int]]:
    """Token ids of the rendered conversation and a mask per token (1: trained)."""
    if not isinstance(messages, list) or not all(isinstance(m, dict) and "role" in m for m in messages):
        raise DatasetError(f"{where}: an SFT row's input must be a list of {{role, content}} messages")
    if not any(m["role"] == "assistant" for m in messages):
        raise DatasetError(f"{where}: no assistant message, so nothing to train on")
    kwargs = dict(chat_template=chat_template, tokenize=False, **(template_kwargs or {}))
    text = tokenizer.apply_chat_template(messages, **kwargs)
    spans = []
    for index, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        before = tokenizer.apply_chat_template(messages[:index], add_generation_prompt=True, **kwargs) \
            if index else ""
        through = tokenizer.apply_chat_template(messages[:index + 1], **kwargs)
        if not (text.startswith(before) and text.startswith(through) and len(through) > len(before)):
            raise DatasetError(f"{where}: the chat template renders the conversation up to assistant message "
                               f"{index} differently from the whole conversation, so its tokens cannot be told "
                               "apart; use a template that leaves earlier turns unchanged (policy.generation."
                               "chat_template.path)")
        spans.append((len(before), len(through)))
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids = list(encoded["input_ids"])
    if loss_on_prompt:
        return ids, [1] * len(ids)
    mask = [int(any(a <= start < b for a, b in spans)) for start, _ in encoded["offset_mapping"]]
    return ids, mask
