from pathlib import Path
import subprocess

import os

def test_link():
    assert os.path.islink("/app/latest") and os.readlink("/app/latest").rstrip("/") in ("releases/v2", "/app/releases/v2")

def test_target():
    assert Path("/app/latest/VERSION").read_text().strip() == "2.0"
