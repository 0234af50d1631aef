from pathlib import Path
import subprocess

import os

def test_executable():
    assert os.access("/app/run.sh", os.X_OK)

def test_ran():
    assert Path("/app/out.txt").read_text().strip() == "ran"
