#!/bin/bash
# Harbor verifier with partial credit: reward.json holds the fraction of checks that pass.
python3 "$TEST_DIR/check.py" > /logs/verifier/reward.json
