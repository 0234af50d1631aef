#!/bin/bash
set -e
grep -rl TODO src | sort > todo.txt
