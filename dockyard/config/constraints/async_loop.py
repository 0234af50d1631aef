"""Async GRPO: the settings the asynchronous loop cannot honour."""

from __future__ import annotations

from typing import Iterator

from dockyard.config.constraints.registry import advice, rule
from dockyard.config.errors import Problem
from dockyard.config.schema import MasterConfig


@rule
def async_grpo(cfg: MasterConfig) -> Iterator[Problem]:
    """Async GRPO: colocate false, run_mode default, num_oversample 0, one dataset, IS correction on; no dynamic sampling, reward scaling or shaping."""
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
    """Async: train_global_batch_size (M) a multiple of num_generations_per_prompt (N), so mini-batches hold whole groups (a recommendation)."""
    grpo, m = cfg.grpo, cfg.policy.train_global_batch_size
    n = grpo.num_generations_per_prompt
    if grpo.async_grpo.enabled and m % n:
        yield Problem("policy.train_global_batch_size", f"async GRPO: {m} is not a multiple of "
                      f"grpo.num_generations_per_prompt ({n}), so a mini-batch splits a group; "
                      "a multiple is strongly recommended")


@rule
def partial_rollout(cfg: MasterConfig) -> Iterator[Problem]:
    """mask_offpolicy_in_partial_rollout needs partial_rollout."""
    a = cfg.grpo.async_grpo
    if a.mask_offpolicy_in_partial_rollout and not a.partial_rollout:
        yield Problem("grpo.async_grpo.mask_offpolicy_in_partial_rollout",
                      "only meaningful with grpo.async_grpo.partial_rollout true (no resumed trajectories otherwise)")
