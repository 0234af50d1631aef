#!/bin/bash
set -e
wc -w < essay.txt | tr -d ' ' > words.txt
