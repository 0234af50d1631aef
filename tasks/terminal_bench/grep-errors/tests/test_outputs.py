from pathlib import Path
import subprocess

def test_errors():
    assert Path("/app/errors.txt").read_text().splitlines() == ["10:01 ERROR disk full", "10:04 ERROR timeout"]
