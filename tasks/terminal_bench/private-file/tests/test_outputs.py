from pathlib import Path
import subprocess

import stat

def test_mode():
    assert stat.S_IMODE(Path("/app/secret.txt").stat().st_mode) == 0o600
