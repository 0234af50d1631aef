#!/bin/bash
set -e
git init -q && git add notes.txt && git -c user.name=dockyard -c user.email=d@example.com commit -q -m 'first notes'
