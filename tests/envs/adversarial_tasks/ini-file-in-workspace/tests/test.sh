#!/bin/bash
# the tests run from the workspace (a task whose tests import the agent's modules would do this)
cp /tests/test_outputs.py /app/test_outputs.py
cd /app
if python3 -m pytest test_outputs.py -rA; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
