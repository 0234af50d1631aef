#!/bin/bash
# Terminal-Bench's run-tests.sh, with pytest from the image instead of one fetched with uv at test time
python3 -m pytest $TEST_DIR/test_outputs.py -rA
