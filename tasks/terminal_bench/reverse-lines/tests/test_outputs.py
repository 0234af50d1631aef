from pathlib import Path
import subprocess

def test_reversed():
    assert Path("/app/reversed.txt").read_text().splitlines() == ["three", "two", "one"]
