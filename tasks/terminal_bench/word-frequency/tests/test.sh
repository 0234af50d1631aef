#!/bin/bash
# Harbor verifier: writes the reward (1 or 0) to /logs/verifier/reward.txt
if [ "$(tr -d '[:space:]' < /app/top_word.txt 2>/dev/null)" = "the" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
