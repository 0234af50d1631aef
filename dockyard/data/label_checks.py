"""Checks that a generated row's answer is right, for generators known to emit wrong ones.

reasoning-gym 0.1.25's basic_arithmetic (the path without parentheses) writes the divisor it drew
first into the question but computes the answer with a second one, or silently multiplies when no
exact divisor exists: "Calculate 7 / 5." comes with the answer 35. About a quarter of one-digit
questions are divisions, so without this check a quarter of the rewards and of the validation set
are noise that no policy can learn.
"""

from __future__ import annotations

import ast
import operator
from fractions import Fraction
from typing import Any, Callable

_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def exact_value(expression: str) -> Fraction | None:
    """The exact value of an arithmetic expression of integers, + - * / and parentheses; None when it
    is not one (or divides by zero)."""
    try:
        tree = ast.parse(expression, mode="eval").body
    except SyntaxError:
        return None

    def evaluate(node: ast.AST) -> Fraction:
        if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
            return Fraction(node.value)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            value = evaluate(node.operand)
            return -value if isinstance(node.op, ast.USub) else value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
            return _OPERATORS[type(node.op)](evaluate(node.left), evaluate(node.right))
        raise ValueError(ast.dump(node))

    try:
        return evaluate(tree)
    except (ValueError, ZeroDivisionError):
        return None


def arithmetic_answer_is_right(entry: dict[str, Any]) -> bool:
    """The answer is the exact value of the expression in the entry's metadata."""
    value = exact_value(str(entry["metadata"].get("expression", "")))
    if value is None:
        return False
    try:
        return Fraction(str(entry["answer"]).strip()) == value
    except (ValueError, ZeroDivisionError):
        return False


# generator name -> check of one reasoning-gym entry; generators not listed are trusted
ANSWER_CHECKS: dict[str, Callable[[dict[str, Any]], bool]] = {
    "basic_arithmetic": arithmetic_answer_is_right,
}
