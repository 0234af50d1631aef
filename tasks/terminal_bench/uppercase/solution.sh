#!/bin/bash
set -e
tr '[:lower:]' '[:upper:]' < words.txt > upper.txt
