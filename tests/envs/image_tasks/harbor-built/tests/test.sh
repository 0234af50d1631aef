#!/bin/bash
# Harbor's convention: the reward goes to /logs/verifier/reward.txt
python3 -m pytest -rA /tests/test_state.py && echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt
