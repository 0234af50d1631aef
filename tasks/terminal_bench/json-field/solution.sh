#!/bin/bash
set -e
python3 -c "import json; print(json.load(open('user.json'))['email'])" > email.txt
