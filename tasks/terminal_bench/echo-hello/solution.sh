#!/bin/bash
set -e
echo hello > hello.txt
