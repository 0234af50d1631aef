from pathlib import Path
import subprocess

def test_greeting():
    assert Path("/app/greeting.txt").read_text().strip() == "good morning"
