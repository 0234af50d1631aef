# Shared by the hand-written het templates (slurm/*.sbatch), sourced after their #SBATCH lines:
# validate the config against the allocation, then run the trainer step (jobs/grpo.py --slurm, or
# $ENTRY) whose rank 0 starts the generation servers on het group 1 (and the teacher servers on het
# group 2), forwarding Slurm's signals to it.
# Expects: CONFIG, PYTHON, HOME_DIR, FOLDER, optionally ENTRY, and the overrides as "$@".

mkdir -p "$FOLDER"
ENTRY=${ENTRY:-jobs/grpo.py}   # jobs/sft.py in the SFT template
nodes=0
for ((group = 0; group < ${SLURM_HET_SIZE:-1}; group++)); do
  count=SLURM_JOB_NUM_NODES_HET_GROUP_$group
  nodes=$((nodes + ${!count}))
done

# Validate with this allocation's node count and write the resolved config the tasks read; a config
# that does not fit the allocation stops here, before any step starts.
"$PYTHON" -m dockyard.cli validate --config "$CONFIG" --out "$FOLDER/config.yaml" "cluster.num_nodes=$nodes" "$@"

# Preemption and the time limit (docs/slurm.md): USR2 comes to this shell (B:) 120 s before the limit,
# or at preemption on clusters that send the job's own signal; the trap forwards it to the trainer
# step, whose ranks save at the next safe point and requeue the job (rank 0 runs scontrol requeue).
# SIGTERM (preemption after its grace time, scancel, scontrol requeue) reaches the steps from Slurm
# itself; the trap only keeps this shell waiting while they save. A requeued job restarts this script
# with SLURM_RESTART_COUNT set and the run resumes from its latest complete checkpoint.
forward() { echo "dockyard batch: $1 received; forwarding it to the job steps" >&2; scancel --signal="$1" "$SLURM_JOB_ID"; }
trap 'forward USR2' USR2
trap 'echo "dockyard batch: SIGTERM received; waiting for the trainer to save" >&2' TERM
# The trainer starts with USR2 and SIGTERM blocked (GNU env >= 8.31): a signal that comes while Python
# is still importing stays pending until dockyard handles it, instead of killing the task.
guard=()
if env --block-signal=USR2 true 2>/dev/null; then guard=(env --block-signal=USR2 --block-signal=TERM); fi
run=("${guard[@]}" "$PYTHON")
# cluster.container (docs/slurm.md "Run in a container"): srun's options for the runtime (slurm_oci: the
# bundle is written into $FOLDER now) and the words that start the step in the image, its Python last
flags=()
text=$("$PYTHON" -m dockyard.cli container-step --config "$FOLDER/config.yaml" --folder "$FOLDER" --part srun-flags)
[ -z "$text" ] || mapfile -t flags <<<"$text"
text=$("$PYTHON" -m dockyard.cli container-step --config "$FOLDER/config.yaml" --folder "$FOLDER" --part command)
[ -z "$text" ] || mapfile -t run <<<"$text"
srun --het-group=0 --kill-on-bad-exit=1 "${flags[@]}" \
  "${run[@]}" "$HOME_DIR/$ENTRY" --slurm --config "$FOLDER/config.yaml" --folder "$FOLDER" &
trainer=$!
status=0
wait "$trainer" || status=$?
while kill -0 "$trainer" 2>/dev/null; do  # a trapped signal interrupted `wait`: wait again
  status=0
  wait "$trainer" || status=$?
done
exit "$status"
