#!/bin/bash
# partial credit: the share of the expected count; a sloppy grader that trusts the agent's number
python3 - <<'PY'
text = open("/app/count.txt").read().strip() if __import__("os").path.exists("/app/count.txt") else "0"
try:
    share = float(text) / 3
except ValueError:
    share = 0.0
open("/logs/verifier/reward.txt", "w").write(str(share))
PY
