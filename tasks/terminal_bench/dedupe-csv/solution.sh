#!/bin/bash
set -e
awk '!seen[$0]++' emails.csv > clean.csv
