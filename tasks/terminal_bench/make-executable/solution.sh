#!/bin/bash
set -e
chmod +x run.sh && ./run.sh
