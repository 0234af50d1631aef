"""Generated rows whose answer is wrong never reach training or validation."""

import re
from fractions import Fraction

import pytest
import reasoning_gym

from dockyard.config.schema.data import DatasetConfig
from dockyard.data.datasets import load_prompts
from dockyard.data.label_checks import arithmetic_answer_is_right, exact_value

ONE_DIGIT = {"name": "basic_arithmetic", "seed": 5, "min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1,
             "allow_negation": False, "allow_parentheses": False}


@pytest.mark.parametrize("expression, value", [
    ("7 - 9", Fraction(-2)),
    ("6 / 4", Fraction(3, 2)),
    ("-(3 + 4) * 2", Fraction(-14)),
    ("(8 - 2) / (1 + 2) - 1", Fraction(1)),
    ("2 * 3 + 4 * 5", Fraction(26)),
])
def test_exact_value_of_arithmetic(expression, value):
    assert exact_value(expression) == value


@pytest.mark.parametrize("expression", ["5 / 0", "2 ** 3", "1.5 + 1", "abs(-3)", "x + 1", "3 +", "True + 1", ""])
def test_exact_value_refuses_what_is_not_integer_arithmetic(expression):
    assert exact_value(expression) is None


def test_answer_check_compares_exact_values():
    assert arithmetic_answer_is_right({"answer": "-6", "metadata": {"expression": "4 - 10"}})
    assert not arithmetic_answer_is_right({"answer": "35", "metadata": {"expression": "7 / 5"}})
    assert not arithmetic_answer_is_right({"answer": "1", "metadata": {"expression": "7 / 4"}})   # floor, not 7/4
    assert not arithmetic_answer_is_right({"answer": "seven", "metadata": {"expression": "3 + 4"}})
    assert not arithmetic_answer_is_right({"answer": "7", "metadata": {}})


def _right_by_hand(question: str, answer: str) -> bool:
    a, op, b = re.fullmatch(r"Calculate (\d+) ([-+*/]) (\d+)\.", question).groups()
    a, b = int(a), int(b)
    if op == "/":
        return b != 0 and a % b == 0 and int(answer) == a // b
    return int(answer) == {"+": a + b, "-": a - b, "*": a * b}[op]


def test_one_digit_rows_are_served_right_in_generator_order(capsys):
    size = 60
    raw = [reasoning_gym.create_dataset("basic_arithmetic", size=4 * size, **{k: v for k, v in ONE_DIGIT.items()
                                                                                   if k != "name"})[i]
           for i in range(4 * size)]
    right = [e for e in raw if _right_by_hand(e["question"], e["answer"])]
    wrong_before = sum(not _right_by_hand(e["question"], e["answer"]) for e in raw[:raw.index(right[size - 1]) + 1])

    prompts = load_prompts(DatasetConfig(name="one_digit", generator={**ONE_DIGIT, "size": size}))

    assert [(p.input, p.label) for p in prompts] == [(e["question"], e["answer"]) for e in right[:size]]
    message = capsys.readouterr().err
    # reasoning-gym 0.1.25 gets about one in five of these wrong; a release that fixes it fails here
    assert wrong_before > 0
    assert f"dataset 'one_digit': skipped {wrong_before} basic_arithmetic rows" in message
    assert f"{size} rows kept" in message


def test_generators_without_a_check_are_served_as_generated():
    prompts = load_prompts(DatasetConfig(generator={"name": "chain_sum", "size": 7, "seed": 2}))
    raw = reasoning_gym.create_dataset("chain_sum", size=7, seed=2)
    assert [(p.input, p.label) for p in prompts] == [(e["question"], e["answer"]) for e in raw]
