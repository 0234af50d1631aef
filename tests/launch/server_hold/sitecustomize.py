"""Test support, not product code: a server process started with this folder on PYTHONPATH (through
`cluster.rollout.env`) waits at interpreter start while the file named by DOCKYARD_TEST_SERVER_HOLD
exists, so a test can act while the job's servers are still starting (no race on how fast they are)."""

import os
import time

_hold = os.environ.get("DOCKYARD_TEST_SERVER_HOLD")
if _hold:
    _marker = _hold + ".reached"
    open(_marker, "w").close()
    while os.path.exists(_hold):
        time.sleep(0.1)
