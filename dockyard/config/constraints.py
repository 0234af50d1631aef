"""Cross-field rules: every rule that couples two or more fields lives here, with the text a user
reads. Each rule is a function of a schema-valid MasterConfig that yields Problems; `check` runs
them all so one `dockyard validate` shows every violation.

docs/config-reference.md ("Cross-field constraints") lists these rules; tests/config/test_constraints.py
triggers each one.
"""

from __future__ import annotations

import os

from typing import Callable, Iterable, Iterator

from dockyard.config import topology
from dockyard.config.errors import Problem
from dockyard.config.schema import MasterConfig

Rule = Callable[[MasterConfig], Iterable[Problem]]
RULES: list[Rule] = []


def rule(fn: Rule) -> Rule:
    RULES.append(fn)
    return fn


def check(cfg: MasterConfig) -> list[Problem]:
    return [problem for each in RULES for problem in each(cfg)]


# Advice: settings that are valid but that the seeds recommend against; shown, never refused.
ADVICE: list[Rule] = []


def advice(fn: Rule) -> Rule:
    ADVICE.append(fn)
    return fn


def advise(cfg: MasterConfig) -> list[Problem]:
    return [problem for each in ADVICE for problem in each(cfg)]


def _devices_word(cfg: MasterConfig) -> str:
    return "GPUs" if cfg.cluster.gpus_per_node > 0 else "ranks"


def _mutually_divisible(a: int, b: int) -> bool:
    return a > 0 and b > 0 and (a % b == 0 or b % a == 0)


# --- DP and batch sizes (seed 002, 11.9) ------------------------------------------------------

@rule
def trainer_world_divides_model_parallel(cfg: MasterConfig) -> Iterator[Problem]:
    """The trainer gets at least one node, and its GPUs (ranks on CPU) divide by TP x PP x CP (seed 002 11.9 rule 2)."""
    world, mp = topology.trainer_world_size(cfg), topology.model_parallel_size(cfg)
    if world <= 0:
        yield Problem("cluster.trainer.num_nodes", f"the trainer gets {topology.trainer_nodes(cfg)} nodes; "
                      "it needs at least one (check cluster.num_nodes against the rollout and teacher nodes)")
    elif world % mp:
        section = "policy.megatron_cfg" if cfg.policy.backend == "megatron" else "policy.dtensor_cfg"
        yield Problem(section, f"trainer {_devices_word(cfg)} ({world}) must be divisible by TP*PP*CP ({mp})")


@rule
def rollouts_divide_into_mini_batches(cfg: MasterConfig) -> Iterator[Problem]:
    """grpo.num_prompts_per_step x grpo.num_generations_per_prompt (B x N) divides by policy.train_global_batch_size (M) (11.9 rule 3)."""
    b, n, m = cfg.grpo.num_prompts_per_step, cfg.grpo.num_generations_per_prompt, cfg.policy.train_global_batch_size
    if (b * n) % m:
        yield Problem("policy.train_global_batch_size",
                      f"grpo.num_prompts_per_step x grpo.num_generations_per_prompt ({b} x {n} = {b * n}) "
                      f"is not divisible by policy.train_global_batch_size ({m})")


@rule
def prompts_divide_over_dp_and_mini_batches(cfg: MasterConfig) -> Iterator[Problem]:
    """Each dataset's prompts per step divide by dp_size x num_mini_batch, where num_mini_batch = B x N / M; per-dataset shares add up to B (11.9 rule 4)."""
    dp, b, n, m = (topology.dp_size(cfg), cfg.grpo.num_prompts_per_step,
                   cfg.grpo.num_generations_per_prompt, cfg.policy.train_global_batch_size)
    if dp == 0 or (b * n) % m:
        return  # the two rules above already report this
    mini = (b * n) // m
    datasets = cfg.data.datasets
    shares = [d.num_prompts_per_step for d in datasets]
    if len(datasets) > 1 and any(s is not None for s in shares):
        if any(s is None for s in shares):
            yield Problem("data.datasets", "set num_prompts_per_step on every dataset or on none")
            return
        if sum(shares) != b:
            yield Problem("data.datasets", f"the datasets' num_prompts_per_step add up to {sum(shares)}, "
                          f"but grpo.num_prompts_per_step is {b}")
    elif len(datasets) > 1:
        return  # weighted mixing: the per-step split is decided at run time
    for index, dataset in enumerate(datasets):
        share = dataset.num_prompts_per_step or b
        if share % (dp * mini):
            yield Problem(f"data.datasets[{index}].num_prompts_per_step",
                          f"data.datasets[{index}] num_prompts_per_step ({share}) is not divisible by "
                          f"(dp_size * num_mini_batch) = ({dp} * {mini}) = {dp * mini}")


@rule
def micro_batches_fill_a_step(cfg: MasterConfig) -> Iterator[Problem]:
    """Without dynamic batching, M divides by dp_size x policy.train_micro_batch_size."""
    dp, policy = topology.dp_size(cfg), cfg.policy
    if dp and not policy.dynamic_batching.enabled:
        per_step = dp * policy.train_micro_batch_size
        if policy.train_global_batch_size % per_step:
            yield Problem("policy.train_micro_batch_size",
                          f"policy.train_global_batch_size ({policy.train_global_batch_size}) must be divisible "
                          f"by dp_size x train_micro_batch_size ({dp} x {policy.train_micro_batch_size} = "
                          f"{per_step})")


@rule
def shared_prompt_rows(cfg: MasterConfig) -> Iterator[Problem]:
    """policy.dynamic_batching.share_prompts needs dynamic batching (its budget sizes the rows) and the dtensor backend."""
    batching = cfg.policy.dynamic_batching
    if not batching.share_prompts:
        return
    if not batching.enabled:
        yield Problem("policy.dynamic_batching.share_prompts",
                      "shared-prompt rows are sized by the token budget: set policy.dynamic_batching.enabled=true")
    if cfg.policy.backend != "dtensor":
        yield Problem("policy.dynamic_batching.share_prompts",
                      f"shared-prompt rows are built by the dtensor backend, not {cfg.policy.backend}")


@rule
def megatron_parallelism(cfg: MasterConfig) -> Iterator[Problem]:
    """backend megatron needs policy.megatron_cfg; trainer GPUs divide by ETP x EP x PP; virtual pipeline stages need PP > 1."""
    if cfg.policy.backend != "megatron":
        return
    m = cfg.policy.megatron_cfg
    if m is None:
        yield Problem("policy.megatron_cfg", "policy.backend is megatron, so policy.megatron_cfg must be set")
        return
    world = topology.trainer_world_size(cfg)
    etp = m.expert_tensor_parallel_size or m.tensor_model_parallel_size
    expert = etp * m.expert_model_parallel_size * m.pipeline_model_parallel_size
    if world > 0 and world % expert:
        yield Problem("policy.megatron_cfg.expert_model_parallel_size",
                      f"trainer {_devices_word(cfg)} ({world}) must be divisible by ETP*EP*PP ({expert})")
    if m.virtual_pipeline_model_parallel_size is not None and m.pipeline_model_parallel_size < 2:
        yield Problem("policy.megatron_cfg.virtual_pipeline_model_parallel_size",
                      "virtual pipeline stages need pipeline_model_parallel_size > 1")


@rule
def sequence_budgets(cfg: MasterConfig) -> Iterator[Problem]:
    """A dynamic-batching budget holds at least one full sequence; max_new_tokens leaves room for a prompt."""
    policy = cfg.policy
    total = policy.max_total_sequence_length
    if policy.dynamic_batching.enabled and policy.dynamic_batching.max_tokens_per_gpu < total:
        yield Problem("policy.dynamic_batching.max_tokens_per_gpu",
                      f"{policy.dynamic_batching.max_tokens_per_gpu} is smaller than "
                      f"policy.max_total_sequence_length ({total}): one sequence would not fit")
    if policy.generation.max_new_tokens is not None and policy.generation.max_new_tokens >= total:
        yield Problem("policy.generation.max_new_tokens",
                      f"{policy.generation.max_new_tokens} leaves no room for the prompt within "
                      f"policy.max_total_sequence_length ({total})")


# --- placement (seed 002, 11.10) --------------------------------------------------------------

@rule
def group_placement(cfg: MasterConfig) -> Iterator[Problem]:
    """colocate true: rollout and teacher GPUs are each <= trainer GPUs; colocate false: a rollout group exists and trainer + rollout + teacher nodes = cluster.num_nodes (11.10)."""
    cluster = cfg.cluster
    trainer = topology.trainer_world_size(cfg)
    if cluster.colocate:
        rollout = topology.rollout_devices(cfg)
        if rollout > trainer:
            yield Problem("cluster.rollout", f"with cluster.colocate true, rollout {_devices_word(cfg)} ({rollout}) "
                          f"must be <= trainer {_devices_word(cfg)} ({trainer})")
        teacher = topology.teacher_devices(cfg)
        if teacher > trainer:
            yield Problem("cluster.teacher", f"with cluster.colocate true, teacher {_devices_word(cfg)} ({teacher}) "
                          f"must be <= trainer {_devices_word(cfg)} ({trainer})")
        return
    if cluster.rollout.num_nodes < 1:
        yield Problem("cluster.rollout.num_nodes", "with cluster.colocate false the rollout group needs at least one node")
    used = topology.trainer_nodes(cfg) + cluster.rollout.num_nodes + cluster.teacher.num_nodes
    if cluster.trainer.num_nodes is not None and used != cluster.num_nodes:
        yield Problem("cluster.num_nodes", f"trainer + rollout + teacher nodes ({cluster.trainer.num_nodes} + "
                      f"{cluster.rollout.num_nodes} + {cluster.teacher.num_nodes} = {used}) must equal "
                      f"cluster.num_nodes ({cluster.num_nodes})")


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


# --- on-policy distillation (seed 000, seed 002 8 and 11.11) -----------------------------------

@rule
def distillation(cfg: MasterConfig) -> Iterator[Problem]:
    """OPD: on_policy_distillation is set, async GRPO on, no data_plane, prev_logprobs not skipped (seed 000); pg/gkd ratio rules (seed 002 8); teacher names resolve; teacher GPUs > 0 divide by teacher TP x PP x CP, and teacher_dp divides with the number of teachers and with the trainer dp_size (11.11)."""
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
                      f"teacher {_devices_word(cfg)} ({teacher_devices}) must be divisible by teacher TP*PP*CP ({mp})")
        return
    teacher_dp = teacher_devices // mp
    if not _mutually_divisible(teacher_dp, len(names)):
        yield Problem("on_policy_distillation.teachers",
                      f"teacher_dp ({teacher_dp}) and the number of teachers ({len(names)}) must divide one another")
    train_dp = topology.dp_size(cfg)
    if train_dp and not _mutually_divisible(teacher_dp, train_dp):
        yield Problem("on_policy_distillation.parallelism",
                      f"teacher_dp ({teacher_dp}) and trainer dp_size ({train_dp}) must divide one another")


# --- async GRPO (seed 000; seed 002 2 and 11.3) -----------------------------------------------

@rule
def async_grpo(cfg: MasterConfig) -> Iterator[Problem]:
    """Async GRPO: colocate false, run_mode default, num_oversample 0, one dataset, IS correction on; no dynamic sampling, reward scaling or shaping (seed 000, seed 002 2 and 11.3)."""
    grpo = cfg.grpo
    if not grpo.async_grpo.enabled:
        return
    why = "async GRPO (grpo.async_grpo.enabled) "
    if cfg.cluster.colocate:
        yield Problem("cluster.colocate", why + "runs rollout and training on disjoint resources; set it to false")
    if grpo.run_mode != "default":
        yield Problem("grpo.run_mode", why + f"only supports run_mode default, not {grpo.run_mode!r}")
    if grpo.sampler.num_oversample:
        yield Problem("grpo.sampler.num_oversample", why + "needs 0; extra capacity comes from "
                      "grpo.async_grpo.max_staleness_steps")
    if grpo.sampler.dynamic_sampling:
        yield Problem("grpo.sampler.dynamic_sampling", why + "does not support dynamic sampling")
    if grpo.reward_scaling.enabled:
        yield Problem("grpo.reward_scaling.enabled", why + "does not support reward scaling")
    if grpo.reward_shaping.enabled:
        yield Problem("grpo.reward_shaping.enabled", why + "does not support reward shaping")
    if len(cfg.data.datasets) > 1:
        yield Problem("data.datasets", why + f"supports one dataset (one dataloader), got {len(cfg.data.datasets)}")
    if not cfg.loss_fn.is_correction.enabled:
        yield Problem("loss_fn.is_correction.enabled", why + "samples with stale weights, so importance-sampling "
                      "correction is mandatory; set it to true (with lower_bound / upper_bound)")


@advice
def async_whole_groups(cfg: MasterConfig) -> Iterator[Problem]:
    """Async: train_global_batch_size (M) a multiple of num_generations_per_prompt (N), so mini-batches hold whole groups (11.3, a recommendation)."""
    grpo, m = cfg.grpo, cfg.policy.train_global_batch_size
    n = grpo.num_generations_per_prompt
    if grpo.async_grpo.enabled and m % n:
        yield Problem("policy.train_global_batch_size", f"async GRPO: {m} is not a multiple of "
                      f"grpo.num_generations_per_prompt ({n}), so a mini-batch splits a group; "
                      "a multiple is strongly recommended")


@rule
def partial_rollout(cfg: MasterConfig) -> Iterator[Problem]:
    """mask_offpolicy_in_partial_rollout needs partial_rollout (11.4)."""
    a = cfg.grpo.async_grpo
    if a.mask_offpolicy_in_partial_rollout and not a.partial_rollout:
        yield Problem("grpo.async_grpo.mask_offpolicy_in_partial_rollout",
                      "only meaningful with grpo.async_grpo.partial_rollout true (no resumed trajectories otherwise)")


# --- off-policy safeguards and the reference model (seed 002, 9 and 11.1-11.2) -----------------

@rule
def rollout_logprobs_exclusive(cfg: MasterConfig) -> Iterator[Problem]:
    """loss_fn.use_rollout_logprobs excludes IS correction and M2PO (11.2)."""
    loss = cfg.loss_fn
    if loss.use_rollout_logprobs and loss.is_correction.enabled:
        yield Problem("loss_fn.is_correction.enabled", "cannot be combined with loss_fn.use_rollout_logprobs "
                      "(the correction compares trainer logprobs with the rollout's)")
    if loss.use_rollout_logprobs and loss.m2po.enabled:
        yield Problem("loss_fn.m2po.enabled", "cannot be combined with loss_fn.use_rollout_logprobs "
                      "(M2PO compares trainer logprobs with the rollout's)")


@rule
def is_correction_bounds(cfg: MasterConfig) -> Iterator[Problem]:
    """IS correction needs lower_bound <= 1 <= upper_bound, lower < upper (seed 002 9.2)."""
    isc = cfg.loss_fn.is_correction
    if not isc.enabled:
        return
    for bound in ("lower_bound", "upper_bound"):
        if getattr(isc, bound) is None:
            yield Problem(f"loss_fn.is_correction.{bound}", "required when is_correction is enabled "
                          "(suggested 0.5 / 2.0 at token level, 0.9999 / 1.0001 geometric)")
    if isc.lower_bound is not None and isc.upper_bound is not None:
        if not isc.lower_bound <= 1 <= isc.upper_bound or isc.lower_bound >= isc.upper_bound:
            yield Problem("loss_fn.is_correction", f"bounds [{isc.lower_bound}, {isc.upper_bound}] must satisfy "
                          "lower_bound <= 1 <= upper_bound with lower_bound < upper_bound")


@rule
def reference_model(cfg: MasterConfig) -> Iterator[Problem]:
    """A KL penalty needs a reference (hf_path or checkpoint_path); a moving reference and KL-in-reward need the penalty on; dual clip only for clipped_pg (11.1)."""
    loss = cfg.loss_fn
    ref = loss.reference_model
    kl_on = loss.reference_policy_kl_penalty > 0
    if kl_on and not (ref.hf_path or ref.checkpoint_path):
        yield Problem("loss_fn.reference_model", "loss_fn.reference_policy_kl_penalty > 0 needs a reference: "
                      "set reference_model.hf_path or reference_model.checkpoint_path")
    if ref.update_interval > 0 and not kl_on:
        yield Problem("loss_fn.reference_model.update_interval",
                      "a moving reference needs loss_fn.reference_policy_kl_penalty > 0")
    if loss.kl_in_reward and not kl_on:
        yield Problem("loss_fn.kl_in_reward", "needs loss_fn.reference_policy_kl_penalty > 0")
    if loss.use_unbiased_kl and not kl_on:
        yield Problem("loss_fn.use_unbiased_kl", "weights the reference KL, which is off: needs "
                      "loss_fn.reference_policy_kl_penalty > 0")
    elif loss.use_unbiased_kl and loss.kl_in_reward:
        # the reward's KL is taken before training, where the ratio it would be weighted by is 1
        yield Problem("loss_fn.use_unbiased_kl", "weights the KL term of the loss by the importance ratio; with "
                      "loss_fn.kl_in_reward the KL goes into the reward before training (ratio 1), so it would "
                      "have no effect: set one of them to false")
    if loss.ratio_clip_c is not None and loss.name != "clipped_pg":
        yield Problem("loss_fn.ratio_clip_c", f"dual clip applies to loss clipped_pg only, not {loss.name!r}")


# --- precision (seed 002, 11.7) ---------------------------------------------------------------

@rule
def precision(cfg: MasterConfig) -> Iterator[Problem]:
    """megatron bf16 / fp16 are exclusive and agree with policy.precision; fp8 needs bf16 or fp16, fp8_param needs fp8 (11.7); fp8 serving needs GPUs and non-fp32 training."""
    policy = cfg.policy
    m = policy.megatron_cfg
    if m is not None:
        if m.bf16 and m.fp16:
            yield Problem("policy.megatron_cfg", "bf16 and fp16 are mutually exclusive; pick one")
        elif policy.backend == "megatron":
            chosen = "bf16" if m.bf16 else "fp16" if m.fp16 else "fp32"
            if chosen != policy.precision:
                yield Problem("policy.megatron_cfg", f"megatron trains in {chosen} (bf16={m.bf16}, fp16={m.fp16}) "
                              f"but policy.precision is {policy.precision!r}; make them agree")
        if m.fp8 is not None and not (m.bf16 or m.fp16):
            yield Problem("policy.megatron_cfg.fp8", "FP8 needs bf16 or fp16 as the primary precision")
        if m.fp8_param and m.fp8 is None:
            yield Problem("policy.megatron_cfg.fp8_param", "fp8_param needs an fp8 recipe")
    if policy.generation.vllm_cfg.precision == "fp8" and policy.generation.backend == "vllm":
        if cfg.cluster.gpus_per_node == 0:
            yield Problem("policy.generation.vllm_cfg.precision", "fp8 serving needs GPUs (cluster.gpus_per_node > 0)")
        if policy.precision == "fp32":
            yield Problem("policy.generation.vllm_cfg.precision", "fp8 serving quantises bf16/fp16 training "
                          "weights; policy.precision is fp32")


# --- generation inputs (seed 000) ---------------------------------------------------------------

@rule
def multimodal_inputs(cfg: MasterConfig) -> Iterator[Problem]:
    """Image inputs need a backend that forwards them: vLLM. SGLang's client does not yet (seed 000),
    and the embedded engine serves text-only models."""
    gen = cfg.policy.generation
    if gen.allow_multimodal_inputs and gen.backend == "sglang":
        yield Problem("policy.generation.allow_multimodal_inputs", "the sglang backend does not forward images "
                      "yet; use backend vllm or turn image inputs off")
    if gen.allow_multimodal_inputs and gen.backend == "embedded":
        yield Problem("policy.generation.allow_multimodal_inputs", "the embedded engine serves text-only "
                      "models; use backend vllm or turn image inputs off")


@rule
def multi_turn_needs_agent(cfg: MasterConfig) -> Iterator[Problem]:
    """grpo.max_rollout_turns > 1 needs env.agent."""
    if cfg.grpo.max_rollout_turns > 1 and cfg.env.agent is None:
        yield Problem("env.agent", f"grpo.max_rollout_turns is {cfg.grpo.max_rollout_turns}; multi-turn "
                      "rollouts need an agent (see `dockyard list`)")


@rule
def reward_scaling_range(cfg: MasterConfig) -> Iterator[Problem]:
    """Reward scaling needs source_max > source_min."""
    scaling = cfg.grpo.reward_scaling
    if scaling.enabled and scaling.source_max <= scaling.source_min:
        yield Problem("grpo.reward_scaling.source_max",
                      f"{scaling.source_max} must be > source_min ({scaling.source_min})")


# --- saving and evaluation (seed 002, 11.6 and 11.8) --------------------------------------------

@rule
def saving(cfg: MasterConfig) -> Iterator[Problem]:
    """Enabled checkpointing writes something (save_state or export_hf); keep_top_k needs metric_name (11.8)."""
    ckpt = cfg.checkpointing
    if ckpt.enabled and not (ckpt.save_state or ckpt.export_hf):
        yield Problem("checkpointing.save_state", "checkpointing is enabled but save_state and export_hf are "
                      "both false, so nothing would be written; set one (or enabled: false)")
    if ckpt.keep_top_k is not None and not ckpt.metric_name:
        yield Problem("checkpointing.metric_name", "keep_top_k ranks checkpoints by a metric; set metric_name")


@rule
def evaluation(cfg: MasterConfig) -> Iterator[Problem]:
    """Validation cadence (grpo.val_period, grpo.val_at_start, sft.val_period) needs data.validation (11.6)."""
    if cfg.data.validation is not None:
        return
    if cfg.grpo.val_period > 0:
        yield Problem("grpo.val_period", f"validation every {cfg.grpo.val_period} steps needs data.validation")
    if cfg.grpo.val_at_start:
        yield Problem("grpo.val_at_start", "validation at start needs data.validation")
    if cfg.sft is not None and cfg.sft.val_period > 0:
        yield Problem("sft.val_period", f"validation every {cfg.sft.val_period} steps needs data.validation")


@rule
def tracking(cfg: MasterConfig) -> Iterator[Problem]:
    """MLflow logging needs logger.mlflow.tracking_uri (seed 002 6)."""
    if cfg.logger.mlflow_enabled and not cfg.logger.mlflow.tracking_uri and not os.environ.get("MLFLOW_TRACKING_URI"):
        yield Problem("logger.mlflow.tracking_uri", "required when logger.mlflow_enabled is true (or set "
                      "MLFLOW_TRACKING_URI)")


# --- the optimizer ---------------------------------------------------------------------------

@rule
def adam_settings_need_adam(cfg: MasterConfig) -> Iterator[Problem]:
    """betas and eps belong to AdamW; with sgd they would be ignored."""
    opt = cfg.policy.optimizer
    if opt.name == "sgd":
        defaults = type(opt).model_fields
        for name in ("betas", "eps"):
            if getattr(opt, name) != defaults[name].default:
                yield Problem(f"policy.optimizer.{name}", "an AdamW setting; policy.optimizer.name is sgd, which has "
                              "none: remove it or use adamw")
