#!/bin/bash
# A SWE-bench Pro run script (run_scripts/<instance_id>/run_script.sh), in the published scripts' form:
# called with the selected test files joined by commas, it runs them from /app.
set -e

run_all_tests() {
  echo "Running all tests..."
  cd /app
  python3 -m pytest -v -p no:cacheprovider tests/
}

run_selected_tests() {
  local test_files=("$@")
  echo "Running selected tests: ${test_files[@]}"
  cd /app
  python3 -m pytest -v -p no:cacheprovider "${test_files[@]}"
}

if [ $# -eq 0 ]; then
  run_all_tests
  exit $?
fi

if [[ "$1" == *","* ]]; then
  IFS=',' read -r -a TEST_FILES <<< "$1"
else
  TEST_FILES=("$@")
fi

run_selected_tests "${TEST_FILES[@]}"
