"""A generated task as a Terminal-Bench 1 task folder (the layout of tasks/terminal_bench/), written
byte for byte the same from the same instance: task.yaml, Dockerfile, files/, solution.sh,
run-tests.sh, tests/test_outputs.py."""

from __future__ import annotations

import os
from pathlib import Path

import yaml

from dockyard.envs.terminal_families.core import TaskInstance

DOCKERFILE = "FROM ghcr.io/laude-institute/t-bench/python-3-13:20250620\nWORKDIR /app\nCOPY files/ /app/\n"
RUN_TESTS = ("#!/bin/bash\n# Terminal-Bench's run-tests.sh, offline: pytest comes with the sandbox, not from uv.\n"
             "cd \"${TASK_WORKDIR:-$PWD}\"\npython3 -m pytest \"$TEST_DIR/test_outputs.py\" -rA -p no:cacheprovider\n")
DIFFICULTY = {1: "easy", 2: "medium", 3: "hard"}


def _write(path: Path, text: str, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    os.chmod(path, mode)


def write_task(task: TaskInstance, folder: Path) -> None:
    meta = {"instruction": task.instruction, "author_name": "dockyard task families", "difficulty":
            DIFFICULTY[task.level], "category": task.category,
            "tags": [task.family, f"level-{task.level}"], "parser_name": "pytest", "max_agent_timeout_sec": 180,
            "max_test_timeout_sec": 60, "run_tests_in_same_shell": False}
    _write(folder / "task.yaml", yaml.safe_dump(meta, sort_keys=False, width=1000))
    _write(folder / "Dockerfile", DOCKERFILE)
    _write(folder / "run-tests.sh", RUN_TESTS, 0o755)
    _write(folder / "solution.sh", "#!/bin/bash\nset -e\n" + task.solution, 0o755)
    _write(folder / "tests" / "test_outputs.py", task.tests)
    (folder / "files").mkdir(parents=True, exist_ok=True)
    for name, text in sorted(task.files.items()):
        _write(folder / "files" / name, text, 0o755 if name in task.executable else 0o644)
