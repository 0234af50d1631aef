from pathlib import Path
import subprocess

def test_unique():
    names = Path("/app/names.txt").read_text().split()
    assert Path("/app/unique.txt").read_text().split("\n")[:-1] == sorted(set(names))
