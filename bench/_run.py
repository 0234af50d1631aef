"""Shared by the bench scripts: run `dockyard run` in a folder and read back its per-step metrics."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def run_dockyard(config: str, overrides: list[str], folder: Path) -> list[dict]:
    """Run the config with the repository's models; exit with the run's output if it fails."""
    command = [sys.executable, "-m", "dockyard.cli", "run", "--config", config, f"models_dir={REPO / 'models'}",
               *overrides]
    result = subprocess.run(command, cwd=folder, capture_output=True, text=True)
    if result.returncode != 0:
        print(result.stdout[-3000:], result.stderr[-3000:], file=sys.stderr)
        sys.exit(result.returncode)
    metrics = next(Path(folder).glob("runs/*/logs/metrics.jsonl"))
    return [json.loads(line) for line in metrics.read_text().splitlines()]
