#!/bin/bash
set -e
echo 'Hello, world!' > hello.txt
