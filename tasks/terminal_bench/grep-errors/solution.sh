#!/bin/bash
set -e
grep ERROR app.log > errors.txt
