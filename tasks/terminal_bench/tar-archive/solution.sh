#!/bin/bash
set -e
tar czf docs.tar.gz docs
