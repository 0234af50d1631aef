#!/bin/bash
set -e
awk '{print NR ": " $0}' poem.txt > numbered.txt
