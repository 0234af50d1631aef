from pathlib import Path
import subprocess

def test_no_tmp():
    assert not list(Path("/app/work").rglob("*.tmp"))

def test_others_kept():
    kept = sorted(str(p.relative_to("/app/work")) for p in Path("/app/work").rglob("*") if p.is_file())
    assert kept == ["a.txt", "sub/b.txt"]
