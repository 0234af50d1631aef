#!/bin/bash
sort -k2 -n -r /app/ages.txt | head -n 1 | cut -d' ' -f1 > /app/oldest.txt
