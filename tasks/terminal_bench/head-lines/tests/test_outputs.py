from pathlib import Path
import subprocess

def test_head():
    assert Path("/app/head.txt").read_text().splitlines() == [f"entry {i}" for i in range(5)]
