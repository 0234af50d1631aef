import subprocess
import sys
from pathlib import Path

import pytest

from dockyard.config import ConfigError, load_config

REPO = Path(__file__).resolve().parent.parent


def problems_of(config: str, *overrides: str, config_dirs=()) -> list[str]:
    """The problems load_config reports, as 'path: message' strings ([] when the config is valid)."""
    try:
        load_config(config, list(overrides), list(config_dirs))
    except ConfigError as err:
        return [str(p) for p in err.problems]
    return []


def run_cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dockyard.cli", *args], capture_output=True, text=True,
                          cwd=cwd or REPO, timeout=120)


@pytest.fixture
def write(tmp_path):
    """Write a file under tmp_path and return its path."""

    def _write(relative: str, text: str) -> Path:
        path = tmp_path / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return path

    return _write
