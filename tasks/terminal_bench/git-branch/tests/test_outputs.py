from pathlib import Path
import subprocess

def git(*args):
    return subprocess.run(["git", "-C", "/app", *args], capture_output=True, text=True).stdout.strip()

def test_branch():
    assert git("rev-parse", "--abbrev-ref", "HEAD") == "feature"

def test_commit():
    assert git("log", "--format=%s") == "init"
