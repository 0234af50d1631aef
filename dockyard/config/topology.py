"""Quantities derived from `cluster` and the parallelism settings, shared by the constraints and
the launcher so both count devices the same way."""

from __future__ import annotations

from dockyard.config.schema import MasterConfig


def devices_per_node(cfg: MasterConfig, group_gpus: int | None) -> int:
    """GPUs per node of a group; on CPU (0 GPUs) the trainer's rank count stands in."""
    gpus = cfg.cluster.gpus_per_node if group_gpus is None else group_gpus
    return gpus if gpus > 0 else cfg.cluster.cpu_ranks_per_node


def trainer_nodes(cfg: MasterConfig) -> int:
    cluster = cfg.cluster
    if cluster.trainer.num_nodes is not None:
        return cluster.trainer.num_nodes
    if cluster.colocate:
        return cluster.num_nodes
    return cluster.num_nodes - cluster.rollout.num_nodes - cluster.teacher.num_nodes


def trainer_world_size(cfg: MasterConfig) -> int:
    return trainer_nodes(cfg) * devices_per_node(cfg, cfg.cluster.trainer.gpus_per_node)


def rollout_devices(cfg: MasterConfig) -> int:
    """With colocate and no rollout nodes of its own, rollout time-shares every trainer device."""
    rollout = cfg.cluster.rollout
    if cfg.cluster.colocate and rollout.num_nodes == 0:
        return trainer_world_size(cfg)
    return rollout.num_nodes * devices_per_node(cfg, rollout.gpus_per_node)


def teacher_devices(cfg: MasterConfig) -> int:
    teacher = cfg.cluster.teacher
    if cfg.cluster.colocate and teacher.num_nodes == 0 and cfg.on_policy_distillation is not None:
        return trainer_world_size(cfg)
    return teacher.num_nodes * devices_per_node(cfg, teacher.gpus_per_node)


def model_parallel(cfg: MasterConfig) -> dict[str, int]:
    """TP, PP and CP of the trainer backend in use."""
    if cfg.policy.backend == "megatron" and cfg.policy.megatron_cfg is not None:
        m = cfg.policy.megatron_cfg
        return {"TP": m.tensor_model_parallel_size, "PP": m.pipeline_model_parallel_size,
                "CP": m.context_parallel_size}
    d = cfg.policy.dtensor_cfg
    return {"TP": d.tensor_parallel_size, "PP": 1, "CP": d.context_parallel_size}


def model_parallel_size(cfg: MasterConfig) -> int:
    sizes = model_parallel(cfg)
    return sizes["TP"] * sizes["PP"] * sizes["CP"]


def dp_size(cfg: MasterConfig) -> int:
    """Data-parallel size; 0 when the world size does not divide (a constraint reports that)."""
    world, mp = trainer_world_size(cfg), model_parallel_size(cfg)
    return world // mp if world > 0 and world % mp == 0 else 0


def mesh_line(world: int, data: int, tensor: int, context: int = 1) -> str:
    """The trainer's device mesh in words: the same line from the plan (`dockyard-submit --dry-run`) and
    from the running trainer (its rank 0 prints the mesh it built)."""
    if context > 1:
        return (f"trainer mesh: {world} rank(s) = {data} data-parallel x {context} context-parallel "
                f"(FSDP shards over all ranks; each context-parallel group is {context} neighbouring ranks "
                "splitting the sequence positions)")
    return (f"trainer mesh: {world} rank(s) = {data} data-parallel x {tensor} tensor-parallel "
            f"(FSDP shards over data-parallel; each tensor-parallel group is {tensor} neighbouring ranks)")


def jax_mesh_line(data: int, model: int, platform: str, processes: int) -> str:
    """The jax backend's device mesh in words, from the plan and from the running trainer."""
    where = "one process" if processes == 1 else f"{processes} processes"
    return f"jax trainer mesh: {data} data x {model} model = {data * model} {platform} device(s) in {where}"


def trainer_mesh_line(cfg: MasterConfig) -> str:
    if cfg.policy.backend == "jax":
        mesh = cfg.policy.jax_cfg.mesh
        return jax_mesh_line(mesh.data, mesh.model, "gpu" if cfg.cluster.gpus_per_node else "cpu",
                             trainer_world_size(cfg))
    sizes = model_parallel(cfg)
    return mesh_line(trainer_world_size(cfg), dp_size(cfg), sizes["TP"], sizes["CP"])


def num_mini_batches(cfg: MasterConfig) -> int:
    rollouts = cfg.grpo.num_prompts_per_step * cfg.grpo.num_generations_per_prompt
    return rollouts // cfg.policy.train_global_batch_size


def trainer_tasks_per_node(cfg: MasterConfig) -> int:
    return devices_per_node(cfg, cfg.cluster.trainer.gpus_per_node)


def teacher_servers(cfg: MasterConfig) -> list[tuple[str, int]]:
    """(teacher, replica index) of every teacher server: teacher_dp // teachers replicas per teacher on
    GPUs (at least one; with fewer slots than teachers, teachers share the group's devices), one per
    teacher on CPU."""
    opd = cfg.on_policy_distillation
    if opd is None:
        return []
    p = opd.parallelism
    slots = teacher_devices(cfg) // max(1, p.tensor_parallel_size * p.pipeline_parallel_size * p.context_parallel_size)
    per_teacher = max(1, slots // len(opd.teachers)) if cfg.cluster.gpus_per_node > 0 else 1
    return [(t.name, index) for t in opd.teachers for index in range(per_teacher)]


def server_tasks_per_node(cfg: MasterConfig, group_name: str) -> int:
    """Generation servers per node: one per replica of rollout_gpus_per_replica GPUs, one on CPU.
    Teacher servers per node: teacher_servers spread over the teacher nodes."""
    group = getattr(cfg.cluster, group_name)
    if group.tasks_per_node is not None:
        return group.tasks_per_node
    if group_name == "teacher" and group.num_nodes > 0:
        return max(1, -(-len(teacher_servers(cfg)) // group.num_nodes))
    gpus = cfg.cluster.gpus_per_node if group.gpus_per_node is None else group.gpus_per_node
    if group.num_nodes == 0 and cfg.cluster.colocate:
        gpus = cfg.cluster.gpus_per_node if cfg.cluster.trainer.gpus_per_node is None \
            else cfg.cluster.trainer.gpus_per_node
    return max(1, gpus // cfg.cluster.rollout_gpus_per_replica)


def rollout_replicas(cfg: MasterConfig) -> int:
    """Generation servers in the run; colocated on CPU that is one next to trainer rank 0, or
    cluster.rollout.tasks_per_node of them."""
    rollout = cfg.cluster.rollout
    if cfg.cluster.colocate and rollout.num_nodes == 0:
        if cfg.cluster.gpus_per_node == 0:
            return rollout.tasks_per_node or 1
        return trainer_nodes(cfg) * server_tasks_per_node(cfg, "rollout")
    return rollout.num_nodes * server_tasks_per_node(cfg, "rollout")
