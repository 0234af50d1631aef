#!/usr/bin/env bash
# The test suite: starts the local Slurm cluster (slurm/dev-cluster/start.sh; needs root, installs
# Debian packages the first time) so the Slurm tests run against a real Slurm, then runs pytest.
# Without root the cluster cannot start and the Slurm tests are skipped (with the reason).
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" = 0 ]; then
  bash slurm/dev-cluster/start.sh
  export DOCKYARD_REQUIRE_SLURM=1   # a broken cluster now fails the Slurm tests instead of skipping them
else
  echo "tools/test.sh: not root; the local Slurm cluster is not started (Slurm tests will skip)" >&2
fi
# llama.cpp's tools as tools/install.sh prepared them (the GGUF export tests)
export DOCKYARD_LLAMA_CPP_DIR=${DOCKYARD_LLAMA_CPP_DIR:-$PWD/.cache/llama.cpp}
# the dockyard image the container tests use, built beside the first tests: the Slurm tests (one unit, the
# suite's longest) find it cached when they reach it (the fixture's build waits on the same lock), so its
# 2-3 minutes leave their path. Same command, output folder and environment as the fixture (tests/launch/conftest.py)
if [ "$(id -u)" = 0 ] && command -v podman >/dev/null 2>&1; then
  images=${DOCKYARD_TEST_IMAGES:-/var/tmp/dockyard-test-images}
  mkdir -p "$images"
  echo "tools/test.sh: building the dockyard image in the background (log: $images/prebuild.log)" >&2
  .venv/bin/python -m dockyard.cli image build --output "$images" >"$images/prebuild.log" 2>&1 &
fi
# two workers (pytest-xdist; tests/conftest.py groups what must share a worker): much of the suite waits
# on Slurm, servers and sleeps, so the second core does the other half meanwhile
exec .venv/bin/python -m pytest -q -n "${DOCKYARD_TEST_WORKERS:-2}" --dist loadscope "$@"
