from pathlib import Path
import subprocess

def test_renamed():
    names = sorted(p.name for p in Path("/app/photos").iterdir())
    assert names == ["beach.jpg", "cat.jpg", "notes.txt"]
