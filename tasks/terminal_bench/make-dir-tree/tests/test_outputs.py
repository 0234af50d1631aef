from pathlib import Path
import subprocess

def test_dirs():
    for d in ("src", "tests", "docs"):
        assert Path("/app/project", d).is_dir()

def test_readme():
    p = Path("/app/project/README.md")
    assert p.is_file() and p.stat().st_size == 0
