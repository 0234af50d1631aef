#!/bin/bash
python3 - <<'PY'
import csv, json
rows = [{"name": r["name"], "age": int(r["age"])} for r in csv.DictReader(open("/app/people.csv"))]
json.dump(rows, open("/app/people.json", "w"))
PY
