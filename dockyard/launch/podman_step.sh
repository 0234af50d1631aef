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
  # TERM to the container's first process (a trainer saves its checkpoint then), as Slurm signals a task outside
  # a container; KILL after 25 s, within Slurm's default KillWait of 30 s after which the step itself is killed;
  # then removed. Not `podman stop` / `rm -t`: in the host's PID namespace they signal through `runc kill --all`,
  # which freezes the container's cgroup meanwhile, and a TERM delivered so may land on any thread of the
  # trainer, whose Python handler then waits for the main thread to wake (seen on scontrol requeue: no save,
  # killed 25 s later, in 2 runs of 3)
  podman --runtime runc kill -s TERM "$name" >/dev/null 2>&1
  waited=0
  while [ "$waited" -lt 50 ] && [ "$(podman --runtime runc inspect --format '{{.State.Running}}' "$name" 2>/dev/null)" = true ]; do
    sleep 0.5
    waited=$((waited + 1))
  done
  if [ "$waited" -ge 50 ]; then
    echo "dockyard podman step: container $name still ran 25 s after its TERM; killing it" >&2
  fi
  podman --runtime runc rm -f -t 0 "$name" >/dev/null 2>&1
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
