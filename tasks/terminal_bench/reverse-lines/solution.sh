#!/bin/bash
set -e
tac list.txt > reversed.txt
