from pathlib import Path
import subprocess

def test_total():
    assert Path("/app/total.txt").read_text().strip() == "1234"
