#!/usr/bin/env bash
# The test suite: starts the local Slurm cluster (slurm/dev-cluster/start.sh; needs root, installs
# Debian packages the first time) so the Slurm tests run against a real Slurm, then runs pytest.
# Without root the cluster cannot start and the Slurm tests are skipped (with the reason).
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" = 0 ]; then
  bash slurm/dev-cluster/start.sh
  # a second cluster for the Slurm tests that do not preempt, so that they run beside the ones that do
  # (tests/conftest.py: slurm_lane)
  DOCKYARD_SLURM_INSTANCE=b bash slurm/dev-cluster/start.sh
  export DOCKYARD_SLURM_B_CONF=/etc/dockyard-slurm-b/slurm.conf
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
# three workers (pytest-xdist; tests/conftest.py groups what must share a worker) on two cores: much of the
# suite waits on Slurm, servers, package indexes and sleeps (a two-worker run left the CPUs idle half the
# time), and the two Slurm lanes each take one worker for most of the run
# (units in the order tests/conftest.py sorts them, the longest first, not xdist's largest-count first)
exec .venv/bin/python -m pytest -q -n "${DOCKYARD_TEST_WORKERS:-3}" --dist loadscope --no-loadscope-reorder "$@"
