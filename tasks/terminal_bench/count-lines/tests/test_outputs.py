from pathlib import Path
import subprocess

def test_count():
    assert Path("/app/count.txt").read_text().strip() == "37"
