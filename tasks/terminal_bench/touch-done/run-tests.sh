#!/bin/bash
# Terminal-Bench's run-tests.sh, offline: pytest comes with the sandbox (python3-pytest), not from uv.
cd "${TASK_WORKDIR:-$PWD}"
python3 -m pytest "$TEST_DIR/test_outputs.py" -rA -p no:cacheprovider
