#!/bin/bash
set -e
tally /data/ledger.csv > /app/total.txt
