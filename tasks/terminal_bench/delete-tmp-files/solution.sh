#!/bin/bash
set -e
find work -name '*.tmp' -type f -delete
