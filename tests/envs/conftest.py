"""Fixtures of the environment tests that build task images (test_task_images.py, test_swe_harness.py)."""

import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.conftest import REPO

BASE = "localhost/dockyard-base:bookworm"

# the adversarial tasks' own tests (tests/envs/adversarial_tasks/*/tests/) run inside sandboxes, not here
collect_ignore = ["adversarial_tasks", "harness_tasks", "image_tasks", "published_tasks", "root_attacks", "service_tasks"]


@pytest.fixture(scope="module")
def open_folder():
    """A folder the sandboxes' users may pass through (pytest's own are 0700 as root)."""
    folder = Path(tempfile.mkdtemp(prefix="dockyard-test-images-", dir="/var/tmp"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def base_image():
    """The local Debian base (built once per machine by tools/build_base_image.sh, about a minute)."""
    result = subprocess.run(["bash", str(REPO / "tools" / "build_base_image.sh"), BASE], capture_output=True,
                            text=True, timeout=900)
    assert result.returncode == 0, result.stderr
    return BASE
