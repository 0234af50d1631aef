#!/bin/bash
set -e
ls -S logs | head -n 1 > largest.txt
