#!/bin/bash
set -e
git init -q && git add README.md && git -c user.name=d -c user.email=d@example.com commit -q -m init && git checkout -q -b feature
