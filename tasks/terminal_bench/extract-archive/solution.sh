#!/bin/bash
set -e
tar xzf bundle.tar.gz && find . -name secret.txt -exec cat {} \; > answer.txt
