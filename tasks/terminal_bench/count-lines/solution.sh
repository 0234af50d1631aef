#!/bin/bash
set -e
wc -l < data.txt | tr -d ' ' > count.txt
