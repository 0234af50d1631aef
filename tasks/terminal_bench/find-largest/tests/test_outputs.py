from pathlib import Path
import subprocess

def test_largest():
    assert Path("/app/largest.txt").read_text().strip() == "b.log"
