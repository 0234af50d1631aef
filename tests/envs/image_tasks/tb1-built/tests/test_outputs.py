from pathlib import Path


def test_low_items():
    assert Path("/srv/work/low.txt").read_text().split() == ["bolts", "washers"]
