#!/bin/bash
tr -cs '[:alpha:]' '\n' < /app/story.txt | tr '[:upper:]' '[:lower:]' | grep -v '^$' | sort | uniq -c | sort -rn | head -n 1 | awk '{print $2}' > /app/top_word.txt
