#!/bin/bash
set -e
ln -s releases/v2 latest
