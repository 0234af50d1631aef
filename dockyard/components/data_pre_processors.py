"""Raw-row pre-processors, applied to a dataset row before messages are built."""

from __future__ import annotations

from typing import Any

from dockyard.registry import register


@register("data_pre_processor", "gsm8k")
def gsm8k(row: dict[str, Any]) -> dict[str, Any]:
    """GSM8K rows: keep the question as input and the number after '####' as the label."""
    answer = str(row["answer"])
    if "####" not in answer:
        raise ValueError("gsm8k row has no '####' final answer in its 'answer' field")
    out = dict(row)
    out["input"] = row["question"]
    out["label"] = answer.rsplit("####", 1)[1].strip().replace(",", "")
    return out
