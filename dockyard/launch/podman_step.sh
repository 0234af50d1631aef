#!/bin/sh
# One Slurm task in a podman container (cluster.container.runtime: podman): podman_step.sh run OPTIONS IMAGE CMD...
#
# Under srun, podman's own signal proxy is not enough: on scancel or a preemption conmon leaves the step and the
# container outlives the job, and the requeued run then meets "name already in use" / "Address already in use"
# (containers-lab.md). So the container gets a name of this task's own (the same in the requeued run, which
# removes what a killed one left), USR2 (Slurm's time-limit warning) is forwarded once, and TERM / INT / HUP
# stop it and remove it before this script ends. srun answers its own SIGTERM by killing the step outright,
# so the driver asks a server to stop with USR1 first (srun forwards it; launch/servers.py).
set -u
name="dockyard-${SLURM_JOB_ID:-local}-${SLURM_STEP_ID:-0}-${SLURM_PROCID:-0}"
[ -n "${SLURM_JOB_ID:-}" ] || name="$name-$$"
[ "${1:-}" = run ] || { echo "podman_step.sh: usage: podman_step.sh run OPTIONS IMAGE CMD..." >&2; exit 2; }
shift
podman --runtime runc rm -f "$name" >/dev/null 2>&1
forward() { podman --runtime runc kill -s "$1" "$name" >/dev/null 2>&1; }
stop() {
  # TERM to the container (a trainer saves its checkpoint then), KILL after 25 s, within Slurm's default
  # KillWait of 30 s after which the step itself is killed; then removed
  podman --runtime runc rm -f -t 25 "$name" >/dev/null 2>&1
  exit 143
}
trap 'forward USR2' USR2
trap stop TERM INT HUP USR1
podman --runtime runc run --name "$name" --sig-proxy=false "$@" &
child=$!
# wait returns early when a trapped signal arrives: wait again until podman itself has ended
while :; do
  wait "$child"
  code=$?
  kill -0 "$child" 2>/dev/null || break
done
podman --runtime runc rm -f "$name" >/dev/null 2>&1
exit "$code"
