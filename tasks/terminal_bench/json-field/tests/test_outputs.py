from pathlib import Path
import subprocess

def test_email():
    assert Path("/app/email.txt").read_text().strip() == "ada@example.org"
