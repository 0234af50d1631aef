from pathlib import Path
import subprocess

def test_todo():
    assert Path("/app/todo.txt").read_text().splitlines() == ["src/app/main.py", "src/util.py"]
