from pathlib import Path
import subprocess

def test_words():
    assert Path("/app/words.txt").read_text().strip() == "12"
