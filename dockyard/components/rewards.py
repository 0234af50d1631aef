"""Reward functions: score a completion against a dataset label."""

from __future__ import annotations

import re
from fractions import Fraction

from dockyard.registry import register

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:/\d+)?")


def _normalise_text(text: str) -> str:
    return " ".join(text.strip().split()).lower()


@register("reward", "exact_match")
class ExactMatch:
    """1.0 when the completion equals the label after trimming and case/space folding."""

    def __call__(self, completion: str, label: str) -> float:
        return float(_normalise_text(completion) == _normalise_text(str(label)))


def _as_number(text: str) -> Fraction | None:
    try:
        return Fraction(text.replace(",", ""))
    except (ValueError, ZeroDivisionError):
        return None


@register("reward", "math_answer")
class MathAnswer:
    """1.0 when the final answer (after '####', in \\boxed{}, or the last number) equals the label."""

    def extract(self, completion: str) -> str | None:
        if "####" in completion:
            return completion.rsplit("####", 1)[1].strip().split("\n")[0].strip()
        boxed = re.findall(r"\\boxed\{([^{}]*)\}", completion)
        if boxed:
            return boxed[-1].strip()
        numbers = _NUMBER.findall(completion)
        return numbers[-1] if numbers else None

    def __call__(self, completion: str, label: str) -> float:
        answer = self.extract(completion)
        if answer is None:
            return 0.0
        got, want = _as_number(answer), _as_number(str(label).strip())
        if got is not None and want is not None:
            return float(got == want)
        return float(_normalise_text(answer) == _normalise_text(str(label)))
