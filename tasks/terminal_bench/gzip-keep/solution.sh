#!/bin/bash
set -e
gzip -k big.txt
