from pathlib import Path
import subprocess

def test_moved():
    assert sorted(p.name for p in Path("/app/logs").iterdir()) == ["a.log", "b.log"]

def test_rest():
    assert Path("/app/keep.txt").exists() and not list(Path("/app").glob("*.log"))
