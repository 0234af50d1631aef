"""One error base: every error class the package defines is a DockyardError, which the entry points
print without a traceback; only the exceptions used for control flow stand apart."""

import ast
import importlib
import subprocess
import sys

from dockyard.errors import DockyardError, EXIT_COMPONENT
from tests.conftest import REPO

CONTROL_FLOW = {"Aborted", "TrainingInterrupted", "RunStopped", "StepAbandoned", "_Closing", "Terminated", "WaitCancelled"}


def defined_exceptions():
    for file in sorted((REPO / "dockyard").rglob("*.py")):
        module = ".".join(file.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
        for node in ast.parse(file.read_text()).body:
            if isinstance(node, ast.ClassDef) and node.bases:
                yield module, node.name


def test_every_error_class_has_the_one_base():
    outside, seen = [], 0
    for module, name in defined_exceptions():
        cls = getattr(importlib.import_module(module), name)
        if not (isinstance(cls, type) and issubclass(cls, BaseException)):
            continue
        seen += 1
        if name not in CONTROL_FLOW and not issubclass(cls, DockyardError):
            outside.append(f"{module}.{name}")
    assert seen > 30
    assert not outside, f"error classes outside dockyard.errors.DockyardError: {outside}"


def test_a_failed_part_exits_with_another_status_than_bad_input():
    from dockyard.launch.servers import ServerFailed
    from dockyard.sandboxes.base import SandboxError

    assert SandboxError.exit_status == ServerFailed.exit_status == EXIT_COMPONENT != DockyardError.exit_status


def test_the_cli_prints_an_error_of_the_base_with_its_command_and_no_traceback(tmp_path):
    missing = tmp_path / "no-checkpoint"
    result = subprocess.run([sys.executable, "-m", "dockyard.cli", "export", "hf", "--checkpoint", str(missing),
                             "--out", str(tmp_path / "out")], capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("dockyard export hf: ") and str(missing) in result.stderr
    assert "Traceback" not in result.stderr
