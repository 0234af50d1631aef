"""The components implemented so far, used as a config would select them."""

import pytest

from dockyard import registry


@pytest.mark.parametrize("completion,label,expected", [
    ("The answer is 42.", "42", 1.0),
    ("so 3 + 4 = 7 #### 7", "7", 1.0),
    ("first 12, then \\boxed{1/2}", "0.5", 1.0),
    ("1,234 apples", "1234", 1.0),
    ("it is 41", "42", 0.0),
    ("no number here", "42", 0.0),
    ("#### Paris", "paris", 1.0),
    ("-3", "-3.0", 1.0),
])
def test_math_answer(completion, label, expected):
    assert registry.build("reward", "math_answer")(completion, label) == expected


def test_exact_match_folds_case_and_space():
    reward = registry.build("reward", "exact_match")
    assert reward("  Hello   World ", "hello world") == 1.0
    assert reward("hello", "hello world") == 0.0


def test_gsm8k_pre_processor():
    gsm8k = registry.get("data_pre_processor", "gsm8k").factory
    row = gsm8k({"question": "How many?", "answer": "2 + 2 = 4\n#### 1,004"})
    assert (row["input"], row["label"]) == ("How many?", "1004")
    with pytest.raises(ValueError, match="no '####'"):
        gsm8k({"question": "q", "answer": "4"})


def test_buffer_replay_strategies():
    fifo = registry.get("buffer_replay_strategy", "fifo").factory
    lifo = registry.get("buffer_replay_strategy", "lifo").factory
    assert fifo([1, 2, 3, 4], 2) == ([1, 2], [3, 4])
    assert lifo([1, 2, 3, 4], 2) == ([4, 3], [1, 2])
    assert lifo([1, 2], 0) == ([], [1, 2])


def test_the_catalog_and_the_implementations_agree():
    """Every entry the catalog marks implemented imports; everything the code builds by name is marked
    implemented (the W&B, MLflow and SwanLab loggers were listed "not yet available" while they worked)."""
    import subprocess
    import sys

    from dockyard.io.loggers import TRACKERS

    for (kind, name), entry in registry._entries.items():
        if entry.target is not None or entry.registered is not None:
            assert callable(entry.factory), (kind, name)
    for name in ["tensorboard", *(name for _, name in TRACKERS)]:
        assert registry.get("logger", name).available, name
    listed = subprocess.run([sys.executable, "-m", "dockyard.cli", "list", "logger"], capture_output=True, text=True,
                            timeout=120).stdout
    assert "wandb" in listed and "not yet available" not in listed, listed
