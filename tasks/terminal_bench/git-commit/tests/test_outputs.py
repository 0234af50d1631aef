from pathlib import Path
import subprocess

def run(*args):
    return subprocess.run(["git", "-C", "/app", *args], capture_output=True, text=True)

def test_commit():
    log = run("log", "--format=%s")
    assert log.returncode == 0 and log.stdout.strip() == "first notes"

def test_file_tracked():
    assert "notes.txt" in run("ls-files").stdout.split()
