#!/bin/bash
set -e
mkdir out
