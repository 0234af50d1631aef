#!/bin/bash
set -e
mkdir -p logs && mv *.log logs/
