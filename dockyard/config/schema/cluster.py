"""`cluster`: how many nodes and GPUs the run has and how they split into trainer / rollout /
teacher groups (the components of the heterogeneous Slurm job)."""

from __future__ import annotations

from typing import Optional

from pydantic import NonNegativeInt, PositiveInt

from dockyard.config.fields import Section, field


class GroupConfig(Section):
    num_nodes: NonNegativeInt = field(0, "Nodes of this group (a separate het-job component when "
                                      "colocate is false).")
    gpus_per_node: Optional[NonNegativeInt] = field(None, "GPUs per node; null uses cluster.gpus_per_node.")


class TrainerGroup(Section):
    num_nodes: Optional[PositiveInt] = field(None, "Trainer nodes; null takes the nodes rollout and "
                                             "teacher do not use.")
    gpus_per_node: Optional[NonNegativeInt] = field(None, "GPUs per node; null uses cluster.gpus_per_node.")


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
