#!/bin/sh
# The dev cluster's RunTimeRun (oci.conf): runc runs the step's bundle, with SLURMD_NODENAME added to its
# environment first. Slurm's OCI mode passes none of the per-task variables, and the logical nodes of this
# cluster share one host name, so without it a step could not tell which node it is
# (dockyard/launch/container_entry.py recovers SLURM_PROCID and the rest from it).
#   oci-run.sh CONTAINER_ID NODE_NAME BUNDLE
set -eu
id=$1 node=$2 bundle=$3
python3 - "$bundle/config.json" "$node" <<'PY'
import json, sys
path, node = sys.argv[1], sys.argv[2]
spec = json.load(open(path))
env = [e for e in spec["process"].get("env", []) if not e.startswith("SLURMD_NODENAME=")]
spec["process"]["env"] = env + [f"SLURMD_NODENAME={node}"]
json.dump(spec, open(path, "w"))
PY
exec runc --root=/run/dockyard-runc run "$id" -b "$bundle"
