from pathlib import Path
import subprocess

def test_numbered():
    assert Path("/app/numbered.txt").read_text().splitlines() == ["1: roses are red", "2: violets are blue", "3: sugar is sweet"]
