"""On-policy distillation: what it needs of the loop and how its teachers are laid out."""

from __future__ import annotations

from typing import Iterator

from dockyard.config import topology
from dockyard.config.constraints.registry import devices_word, mutually_divisible, rule
from dockyard.config.errors import Problem
from dockyard.config.schema import MasterConfig


@rule
def distillation(cfg: MasterConfig) -> Iterator[Problem]:
    """OPD: on_policy_distillation is set, async GRPO on, no data_plane, prev_logprobs not skipped; pg/gkd ratio rules; teacher names resolve; teacher GPUs > 0 divide by teacher TP x PP x CP, and teacher_dp divides with the number of teachers and with the trainer dp_size."""
    if cfg.grpo.adv_estimator.name != "opd":
        return
    opd = cfg.on_policy_distillation
    if opd is None:
        yield Problem("on_policy_distillation", "grpo.adv_estimator.name is opd, so on_policy_distillation "
                      "(its teachers) must be set")
        return
    if not cfg.grpo.async_grpo.enabled:
        yield Problem("grpo.async_grpo.enabled", "OPD collects teacher scores on the async path; it must be true")
    if cfg.data_plane is not None:
        yield Problem("data_plane", "OPD does not run over a data plane; remove data_plane (use the in-memory path)")
    if cfg.grpo.skip_prev_logprobs:
        yield Problem("grpo.skip_prev_logprobs", "the OPD advantage subtracts prev_logprobs; skipping them "
                      "zeroes them, which is refused")
    if opd.pg_ratio <= 0 and opd.gkd_ratio <= 0:
        yield Problem("on_policy_distillation.pg_ratio", "at least one of pg_ratio / gkd_ratio must be > 0")
    if opd.pg_ratio > 0 and opd.gkd_ratio == 1:
        yield Problem("on_policy_distillation.gkd_ratio", "gkd_ratio 1 leaves no policy-gradient branch, so "
                      "pg_ratio must be 0")
    if cfg.grpo.filters.identical_reward:
        yield Problem("grpo.filters.identical_reward", "OPD trains on the teachers' per-token advantages, not the "
                      "environment's reward; dropping groups with equal rewards would throw good rollouts away. "
                      "Set it to false")
    if cfg.policy.generation.temperature != 1.0:
        yield Problem("policy.generation.temperature", "the OPD advantage compares the student's sampling "
                      "distribution with the teacher's own (temperature 1); set it to 1.0")
    names = [t.name for t in opd.teachers]
    for duplicate in sorted({n for n in names if names.count(n) > 1}):
        yield Problem("on_policy_distillation.teachers", f"teacher name {duplicate!r} is used twice")
    for agent, teacher in opd.teacher_model_by_agent_name.items():
        if teacher not in names:
            yield Problem(f"on_policy_distillation.teacher_model_by_agent_name.{agent}",
                          f"{teacher!r} is not a teacher; teachers: {', '.join(names)}")
    if opd.default_teacher is not None and opd.default_teacher not in names:
        yield Problem("on_policy_distillation.default_teacher",
                      f"{opd.default_teacher!r} is not a teacher; teachers: {', '.join(names)}")
    for index, dataset in enumerate(cfg.data.datasets):
        if dataset.teacher_name and dataset.teacher_name not in names:
            yield Problem(f"data.datasets[{index}].teacher_name",
                          f"{dataset.teacher_name!r} is not a teacher; teachers: {', '.join(names)}")
    group = cfg.cluster.teacher
    if group.num_nodes > 0 and group.tasks_per_node is not None \
            and group.tasks_per_node * group.num_nodes < len(topology.teacher_servers(cfg)):
        yield Problem("cluster.teacher.tasks_per_node", f"{len(topology.teacher_servers(cfg))} teacher servers need "
                      f"as many tasks on the teacher nodes, but {group.num_nodes} node(s) x {group.tasks_per_node} "
                      "give fewer (the extra servers would wait for CPUs forever); raise it or leave it unset")
    teacher_devices = topology.teacher_devices(cfg)
    p = opd.parallelism
    mp = p.tensor_parallel_size * p.pipeline_parallel_size * p.context_parallel_size
    if teacher_devices <= 0:
        yield Problem("cluster.teacher", "OPD needs teacher devices: cluster.teacher.num_nodes x gpus_per_node "
                      "must be > 0")
        return
    if teacher_devices % mp:
        yield Problem("on_policy_distillation.parallelism",
                      f"teacher {devices_word(cfg)} ({teacher_devices}) must be divisible by teacher TP*PP*CP ({mp})")
        return
    teacher_dp = teacher_devices // mp
    if not mutually_divisible(teacher_dp, len(names)):
        yield Problem("on_policy_distillation.teachers",
                      f"teacher_dp ({teacher_dp}) and the number of teachers ({len(names)}) must divide one another")
    train_dp = topology.dp_size(cfg)
    if train_dp and not mutually_divisible(teacher_dp, train_dp):
        yield Problem("on_policy_distillation.parallelism",
                      f"teacher_dp ({teacher_dp}) and trainer dp_size ({train_dp}) must divide one another")
