import subprocess
from pathlib import Path


def test_count():
    assert Path("/app/count.txt").read_text().strip() == "3"


def test_the_command_is_installed_for_everyone():
    out = subprocess.run(["/usr/local/bin/count-lines", "/app/data.txt"], capture_output=True, text=True)
    assert out.stdout.strip() == "3"
