#!/bin/bash
set -e
mkdir -p project/src project/tests project/docs && touch project/README.md
