"""How the rollouts of a step divide over data-parallel ranks, mini-batches and micro-batches, and the
parallel layouts the trainer's GPUs must divide by."""

from __future__ import annotations

from typing import Iterator

from dockyard.config import topology
from dockyard.config.constraints.registry import devices_word, rule
from dockyard.config.errors import Problem
from dockyard.config.schema import MasterConfig


@rule
def trainer_world_divides_model_parallel(cfg: MasterConfig) -> Iterator[Problem]:
    """The trainer gets at least one node, and its GPUs (ranks on CPU) divide by TP x PP x CP."""
    world, mp = topology.trainer_world_size(cfg), topology.model_parallel_size(cfg)
    if world <= 0:
        yield Problem("cluster.trainer.num_nodes", f"the trainer gets {topology.trainer_nodes(cfg)} nodes; "
                      "it needs at least one (check cluster.num_nodes against the rollout and teacher nodes)")
    elif world % mp:
        section = "policy.megatron_cfg" if cfg.policy.backend == "megatron" else "policy.dtensor_cfg"
        yield Problem(section, f"trainer {devices_word(cfg)} ({world}) must be divisible by TP*PP*CP ({mp})")


@rule
def rollouts_divide_into_mini_batches(cfg: MasterConfig) -> Iterator[Problem]:
    """grpo.num_prompts_per_step x grpo.num_generations_per_prompt (B x N) divides by policy.train_global_batch_size (M)."""
    b, n, m = cfg.grpo.num_prompts_per_step, cfg.grpo.num_generations_per_prompt, cfg.policy.train_global_batch_size
    if (b * n) % m:
        yield Problem("policy.train_global_batch_size",
                      f"grpo.num_prompts_per_step x grpo.num_generations_per_prompt ({b} x {n} = {b * n}) "
                      f"is not divisible by policy.train_global_batch_size ({m})")


@rule
def prompts_divide_over_dp_and_mini_batches(cfg: MasterConfig) -> Iterator[Problem]:
    """Each dataset's prompts per step divide by dp_size x num_mini_batch, where num_mini_batch = B x N / M; per-dataset shares add up to B."""
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
    """policy.dynamic_batching.share_prompts needs dynamic batching (its budget sizes the rows) and a torch backend."""
    batching = cfg.policy.dynamic_batching
    if not batching.share_prompts:
        return
    if not batching.enabled:
        yield Problem("policy.dynamic_batching.share_prompts",
                      "shared-prompt rows are sized by the token budget: set policy.dynamic_batching.enabled=true")
    if cfg.policy.backend not in ("dtensor", "megatron"):
        yield Problem("policy.dynamic_batching.share_prompts",
                      f"shared-prompt rows are built by the dtensor and megatron backends, not {cfg.policy.backend}")


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
                      f"trainer {devices_word(cfg)} ({world}) must be divisible by ETP*EP*PP ({expert})")
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
