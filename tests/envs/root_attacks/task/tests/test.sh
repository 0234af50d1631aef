#!/bin/bash
# Harbor's convention: the reward goes to /logs/verifier/reward.txt
if python3 -m pytest -rA /tests/test_outputs.py; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
