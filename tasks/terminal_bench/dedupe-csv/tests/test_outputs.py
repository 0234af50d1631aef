from pathlib import Path
import subprocess

def test_clean():
    assert Path("/app/clean.csv").read_text().splitlines() == ["name,email", "ada,ada@example.org", "alan,alan@example.org", "grace,grace@example.org"]
