from pathlib import Path
import subprocess

def test_script_runs():
    out = subprocess.run(["python3", "/app/fib.py"], capture_output=True, text=True)
    assert out.stdout.split() == ["0", "1", "1", "2", "3", "5", "8", "13", "21", "34"]

def test_output_saved():
    assert Path("/app/fib.txt").read_text().split() == ["0", "1", "1", "2", "3", "5", "8", "13", "21", "34"]
