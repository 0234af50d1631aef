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


@register("data_pre_processor", "swe_bench_pro")
def swe_bench_pro(row: dict[str, Any]) -> dict[str, Any]:
    """SWE-bench Pro rows: the prompt is the issue with its requirements and the interface it must
    provide (the three parts of Pro's own prompt); the label is the reference patch."""
    if not row.get("problem_statement"):
        raise ValueError("SWE-bench Pro row has no 'problem_statement'")
    parts = [str(row["problem_statement"]).strip()]
    if row.get("requirements"):
        parts.append("Requirements:\n" + str(row["requirements"]).strip())
    if row.get("interface"):
        parts.append("New interfaces introduced:\n" + str(row["interface"]).strip())
    return {**row, "input": "\n\n".join(parts), "label": row.get("patch")}
