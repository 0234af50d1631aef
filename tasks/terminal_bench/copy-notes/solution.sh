#!/bin/bash
set -e
cp notes.txt backup.txt
