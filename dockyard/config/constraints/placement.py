"""Where the groups run: trainer, rollout and teacher nodes, replicas per node, the Slurm time limit."""

from __future__ import annotations

from typing import Iterator

from dockyard.config import topology
from dockyard.config.constraints.registry import devices_word, rule
from dockyard.config.errors import Problem
from dockyard.config.schema import MasterConfig


@rule
def group_placement(cfg: MasterConfig) -> Iterator[Problem]:
    """colocate true: rollout and teacher GPUs are each <= trainer GPUs; colocate false: a rollout group exists and trainer + rollout + teacher nodes = cluster.num_nodes (with data_plane, rollout nodes size each worker job and are not counted)."""
    cluster = cfg.cluster
    trainer = topology.trainer_world_size(cfg)
    if cluster.colocate:
        rollout = topology.rollout_devices(cfg)
        if rollout > trainer:
            yield Problem("cluster.rollout", f"with cluster.colocate true, rollout {devices_word(cfg)} ({rollout}) "
                          f"must be <= trainer {devices_word(cfg)} ({trainer})")
        teacher = topology.teacher_devices(cfg)
        if teacher > trainer:
            yield Problem("cluster.teacher", f"with cluster.colocate true, teacher {devices_word(cfg)} ({teacher}) "
                          f"must be <= trainer {devices_word(cfg)} ({trainer})")
        return
    if cluster.rollout.num_nodes < 1:
        yield Problem("cluster.rollout.num_nodes", "with cluster.colocate false the rollout group needs at least one node"
                      + (" (with data_plane: the nodes of each rollout-worker job)" if cfg.data_plane else ""))
    # with a data plane the rollout group sizes each rollout-worker job, not a part of the trainer's job
    rollout = 0 if cfg.data_plane is not None else cluster.rollout.num_nodes
    used = topology.trainer_nodes(cfg) + rollout + cluster.teacher.num_nodes
    if cluster.trainer.num_nodes is not None and used != cluster.num_nodes:
        yield Problem("cluster.num_nodes", f"trainer + rollout + teacher nodes ({cluster.trainer.num_nodes} + "
                      f"{rollout} + {cluster.teacher.num_nodes} = {used}) must equal "
                      f"cluster.num_nodes ({cluster.num_nodes})"
                      + ("; with data_plane the rollout nodes are the worker jobs'" if cfg.data_plane else ""))


@rule
def rollout_replicas(cfg: MasterConfig) -> Iterator[Problem]:
    """Rollout GPUs divide into replicas of cluster.rollout_gpus_per_replica."""
    devices, per_replica = topology.rollout_devices(cfg), cfg.cluster.rollout_gpus_per_replica
    if cfg.cluster.gpus_per_node > 0 and devices and devices % per_replica:
        yield Problem("cluster.rollout_gpus_per_replica",
                      f"rollout GPUs ({devices}) are not divisible by GPUs per replica ({per_replica})")


@rule
def server_tasks_fit_gpus(cfg: MasterConfig) -> Iterator[Problem]:
    """Rollout / teacher servers per node x rollout_gpus_per_replica fit the group's GPUs per node."""
    for name in ("rollout", "teacher"):
        group = getattr(cfg.cluster, name)
        gpus = cfg.cluster.gpus_per_node if group.gpus_per_node is None else group.gpus_per_node
        if group.tasks_per_node is None or gpus == 0 or group.num_nodes == 0:
            continue
        need = group.tasks_per_node * cfg.cluster.rollout_gpus_per_replica
        if need > gpus:
            yield Problem(f"cluster.{name}.tasks_per_node", f"{group.tasks_per_node} servers x "
                          f"{cfg.cluster.rollout_gpus_per_replica} GPUs (cluster.rollout_gpus_per_replica) = {need} "
                          f"GPUs per node, but the {name} nodes have {gpus}")


@rule
def slurm_time_limit(cfg: MasterConfig) -> Iterator[Problem]:
    """cluster.slurm.time is minutes or Slurm's [D-]HH:MM[:SS] / MM:SS, and longer than signal_delay_s."""
    from dockyard.config.slurm_time import minutes, SlurmTimeError

    slurm = cfg.cluster.slurm
    try:
        limit = minutes(slurm.time)
    except SlurmTimeError as err:
        yield Problem("cluster.slurm.time", str(err))
        return
    if limit * 60 <= slurm.signal_delay_s:
        yield Problem("cluster.slurm.signal_delay_s", f"the warning signal comes {slurm.signal_delay_s} s before the "
                      f"end, but the time limit is only {limit:g} min; lower it or raise cluster.slurm.time")


@rule
def teachers_only_with_distillation(cfg: MasterConfig) -> Iterator[Problem]:
    """Teacher nodes and on_policy_distillation are only allowed when grpo.adv_estimator.name is opd."""
    opd = cfg.grpo.adv_estimator.name == "opd"
    if not opd and cfg.cluster.teacher.num_nodes > 0:
        yield Problem("cluster.teacher.num_nodes", f"{cfg.cluster.teacher.num_nodes} teacher nodes are requested "
                      "but grpo.adv_estimator.name is not opd, so they would sit idle")
    if not opd and cfg.on_policy_distillation is not None:
        yield Problem("on_policy_distillation", "teachers are configured but grpo.adv_estimator.name is "
                      f"{cfg.grpo.adv_estimator.name!r}; set it to 'opd' or remove the section")
