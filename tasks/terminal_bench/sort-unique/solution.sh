#!/bin/bash
set -e
sort -u names.txt > unique.txt
