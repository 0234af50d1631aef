"""`cluster`: how many nodes and GPUs the run has, how they split into trainer / rollout /
teacher groups (the components of the heterogeneous Slurm job), and the Slurm options of the job."""

from __future__ import annotations

from typing import Literal, Optional, Union

from pydantic import NonNegativeInt, PositiveInt

from dockyard.config.fields import Section, field


class GroupConfig(Section):
    num_nodes: NonNegativeInt = field(0, "Nodes of this group (a separate het-job component when "
                                      "colocate is false).")
    gpus_per_node: Optional[NonNegativeInt] = field(None, "GPUs per node; null uses cluster.gpus_per_node.")
    tasks_per_node: Optional[PositiveInt] = field(None, "Servers per node; null: GPUs per node / "
                                                  "cluster.rollout_gpus_per_replica (1 on CPU).")
    env: dict[str, str] = field({}, "Environment variables for this group's servers only (trainer ranks: policy.env_vars).")


class TrainerGroup(Section):
    num_nodes: Optional[PositiveInt] = field(None, "Trainer nodes; null takes the nodes rollout and "
                                             "teacher do not use.")
    gpus_per_node: Optional[NonNegativeInt] = field(None, "GPUs per node; null uses cluster.gpus_per_node.")


ContainerRuntime = Literal["none", "slurm_oci", "pyxis", "apptainer", "charliecloud", "podman"]


class ComponentContainer(Section):
    """One component's departures from cluster.container (null: as there)."""

    runtime: Optional[ContainerRuntime] = field(None, "The runtime of this component's steps.")
    image: Optional[str] = field(None, "This component's image.")
    mounts: Optional[list[str]] = field(None, "This component's mounts (replace cluster.container.mounts).")
    env: Optional[list[str]] = field(None, "This component's passed-in variables (replace cluster.container.env).")


class ContainerConfig(Section):
    """The container every step of the job runs in (docs/slurm.md "Run in a container")."""

    runtime: ContainerRuntime = field("none", "none (the submitting environment's Python), slurm_oci (srun "
                                      "--container with an OCI bundle), pyxis (srun --container-image), apptainer, "
                                      "charliecloud (ch-run), podman.")
    image: Optional[str] = field(None, "What the runtime runs: slurm_oci the image folder `dockyard image build` "
                                 "wrote (its bundle/), pyxis a .sqsh file or an image reference, apptainer a .sif, "
                                 "charliecloud an image folder, podman an image name.",
                                 "Required unless runtime is none.")
    mounts: list[str] = field([], "SRC:DST[:ro] bind mounts (models, datasets, caches). The submit folder, the job "
                              "folder, logger.log_dir, checkpointing.checkpoint_dir, the Slurm client's "
                              "configuration and munge socket are mounted at their own paths without asking.")
    workdir: Optional[str] = field(None, "Working folder inside; null: the submit folder (mounted at its path).")
    env: list[str] = field([], "Names of further variables passed in from the step's environment (HF_TOKEN, "
                           "WANDB_API_KEY, ...). Slurm's, submitit's and dockyard's own always pass; nothing else "
                           "of the submitter's environment does.")
    python: str = field("/opt/dockyard/venv/bin/python", "The image's Python with dockyard installed.")
    trainer: ComponentContainer = field(ComponentContainer, "The trainer component's departures.")
    rollout: ComponentContainer = field(ComponentContainer, "The rollout component's departures.")
    teacher: ComponentContainer = field(ComponentContainer, "The teacher component's departures.")


class SlurmConfig(Section):
    """Options of the Slurm job dockyard-submit generates (the dockyard-submit flags override them)."""

    partition: Optional[str] = field(None, "Partition (--partition); null: the cluster's default.")
    account: Optional[str] = field(None, "Account to charge (--account).")
    qos: Optional[str] = field(None, "Quality of service (--qos).")
    time: Union[PositiveInt, str] = field(60, "Time limit: minutes, or Slurm's [D-]HH:MM:SS.",
                                          "Every component gets the same limit.")
    constraint: Optional[str] = field(None, "Node features (--constraint).")
    exclusive: bool = field(False, "Whole nodes (--exclusive).")
    mem: Optional[str] = field(None, "Memory per node (--mem), e.g. 200G; null: the cluster's default.")
    cpus_per_task: Optional[PositiveInt] = field(None, "CPUs per task (--cpus-per-task); null: Slurm's default.")
    gpu_flag: Literal["gpus-per-node", "gres"] = field("gpus-per-node", "How GPUs are requested: gpus-per-node or gres "
                          "(--gres=gpu:N, for clusters without GPU-count scheduling).")
    signal_delay_s: PositiveInt = field(120, "Seconds before the time limit at which Slurm sends USR2 "
                                        "(the run checkpoints and requeues).")
    requeue: bool = field(True, "Let Slurm requeue the job after preemption or node failure (--requeue).")
    job_name: Optional[str] = field(None, "Job name; null: the config's name.")
    folder: Optional[str] = field(None, "Job folder for scripts, pickles and logs (must be on a filesystem "
                                  "every node sees); null: <logger.log_dir>/slurm.")
    setup: list[str] = field([], "Shell lines run in the batch script before the job starts "
                             "(module load ..., source venv/bin/activate, export ...).")
    additional: dict[str, Union[str, int, bool]] = field({}, "Further #SBATCH options for every component, "
                                                         "e.g. {reservation: myres}.")
    deadline_margin_s: NonNegativeInt = field(60, "The run saves and requeues itself when the allocation's end "
                                              "is closer than its longest step + longest save + this margin "
                                              "(in case no signal comes in time).")
    server_health_timeout_s: PositiveInt = field(900, "How long the driver waits for each generation server's "
                                                 "/health before it ends the job.")


class ClusterConfig(Section):
    num_nodes: PositiveInt = field(..., "Nodes in the whole run (dockyard-submit --nodes sets it).",
                                   "colocate false: trainer + rollout + teacher nodes must add up to it.")
    gpus_per_node: NonNegativeInt = field(..., "GPUs per node; 0 runs on CPU.")
    cpu_ranks_per_node: PositiveInt = field(2, "Trainer ranks per node when gpus_per_node is 0 "
                                            "(gloo instead of NCCL).")
    colocate: bool = field(True, "Rollout and teacher time-share the trainer's GPUs (one het component).",
                           "true: rollout and teacher GPUs must each be <= trainer GPUs. "
                           "false for async GRPO.")
    trainer: TrainerGroup = field(TrainerGroup, "Trainer group (het component 0).")
    rollout: GroupConfig = field(GroupConfig, "Rollout group (het component 1).",
                                 "colocate false: needs num_nodes >= 1.")
    teacher: GroupConfig = field(GroupConfig, "Teacher group for on-policy distillation (het component 2).")
    rollout_gpus_per_replica: PositiveInt = field(1, "GPUs one generation server uses.",
                                                  "Must divide the rollout GPUs.")
    slurm: SlurmConfig = field(SlurmConfig, "Options of the Slurm job (dockyard-submit).")
    container: ContainerConfig = field(ContainerConfig, "The container the job's steps run in (dockyard-submit).")
