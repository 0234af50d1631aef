from pathlib import Path


def test_the_oldest_is_named():
    assert Path("/app/oldest.txt").read_text().strip() == "grace"


def test_the_input_is_untouched():
    assert Path("/app/ages.txt").read_text().split() == ["ada", "36", "grace", "85", "alan", "41"]
