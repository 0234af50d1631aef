#!/bin/bash
set -e
chmod 600 secret.txt
