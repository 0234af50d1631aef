from pathlib import Path
import subprocess

def test_answer():
    assert Path("/app/answer.txt").read_text().strip() == "swordfish"
