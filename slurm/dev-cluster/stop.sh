#!/usr/bin/env bash
# Stops the local development cluster started by start.sh: cancels every job first (slurmstepd
# outlives slurmd), then signals the daemons in parallel. --keep-db leaves MariaDB and munged up.
# DOCKYARD_SLURM_INSTANCE=b stops the second cluster (start.sh) and leaves the shared daemons up.
set -uo pipefail
keep_db=0; [ "${1:-}" = --keep-db ] && keep_db=1
if [ -n "${DOCKYARD_SLURM_INSTANCE:-}" ]; then
  STATE=${DOCKYARD_SLURM_DIR:-/var/lib/dockyard-slurm-$DOCKYARD_SLURM_INSTANCE}
  export SLURM_CONF=/etc/dockyard-slurm-$DOCKYARD_SLURM_INSTANCE/slurm.conf
  keep_db=1
else
  STATE=${DOCKYARD_SLURM_DIR:-/var/lib/dockyard-slurm}
fi

stop_pid_file() {  # send TERM; the caller waits
  [ -f "$1" ] && kill "$(cat "$1")" 2>/dev/null
  return 0
}
if command -v scancel >/dev/null && [ -f "$STATE/slurmctld.pid" ]; then
  timeout 10 scancel --full --quiet -u root 2>/dev/null
  for _ in $(seq 1 50); do [ -z "$(timeout 5 squeue -h -t R,CG 2>/dev/null)" ] && break; sleep 0.2; done
fi
pids=()
for f in "$STATE"/kicker.pid "$STATE"/slurmd-*.pid "$STATE"/slurmctld.pid "$STATE"/slurmdbd.pid; do
  [ -f "$f" ] || continue
  pid=$(cat "$f"); kill "$pid" 2>/dev/null && pids+=("$pid"); rm -f "$f"
done
if [ $keep_db = 0 ]; then
  for f in /run/mysqld/mariadb.pid /run/munge/munged.pid; do
    [ -f "$f" ] || continue
    pid=$(cat "$f"); kill "$pid" 2>/dev/null && pids+=("$pid")
  done
fi
for _ in $(seq 1 100); do
  running=0
  for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && running=1; done
  [ $running = 0 ] && break
  sleep 0.1
done
for pid in "${pids[@]}"; do kill -9 "$pid" 2>/dev/null; done
pkill -f slurmstepd 2>/dev/null
echo "dev-cluster: stopped"
