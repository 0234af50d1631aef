from pathlib import Path
import subprocess

def test_upper():
    assert Path("/app/upper.txt").read_text() == Path("/app/words.txt").read_text().upper()
