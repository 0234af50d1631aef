#!/bin/bash
# Published test scripts write into /tests (`uv venv`, a marker file), so the verifier may; this task's
# tests also run a check script the agent wrote before pytest (as some tasks run the agent's program)
python3 -m venv --without-pip /tests/.venv && touch /tests/.ran
if [ -x /app/selfcheck.sh ]; then /app/selfcheck.sh; fi
if python3 -m pytest /tests/test_outputs.py -rA; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
