"""Off-policy safeguards and the reference model."""

from __future__ import annotations

from typing import Iterator

from dockyard.config.constraints.registry import rule
from dockyard.config.errors import Problem
from dockyard.config.schema import MasterConfig


@rule
def rollout_logprobs_exclusive(cfg: MasterConfig) -> Iterator[Problem]:
    """loss_fn.use_rollout_logprobs excludes IS correction and M2PO."""
    loss = cfg.loss_fn
    if loss.use_rollout_logprobs and loss.is_correction.enabled:
        yield Problem("loss_fn.is_correction.enabled", "cannot be combined with loss_fn.use_rollout_logprobs "
                      "(the correction compares trainer logprobs with the rollout's)")
    if loss.use_rollout_logprobs and loss.m2po.enabled:
        yield Problem("loss_fn.m2po.enabled", "cannot be combined with loss_fn.use_rollout_logprobs "
                      "(M2PO compares trainer logprobs with the rollout's)")


@rule
def is_correction_bounds(cfg: MasterConfig) -> Iterator[Problem]:
    """IS correction needs lower_bound <= 1 <= upper_bound, lower < upper."""
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
    """A KL penalty needs a reference (hf_path or checkpoint_path); a moving reference and KL-in-reward need the penalty on; dual clip only for clipped_pg."""
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
