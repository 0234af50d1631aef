#!/bin/bash
set -e
printf '%s\n' "$GREETING" > greeting.txt
