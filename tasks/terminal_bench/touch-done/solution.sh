#!/bin/bash
set -e
touch done.txt
