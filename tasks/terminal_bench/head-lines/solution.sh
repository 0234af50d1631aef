#!/bin/bash
set -e
head -n 5 log.txt > head.txt
