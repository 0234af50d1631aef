"""The loss menu of dockyard/algorithms/losses.py in JAX, rebuilt from the same `loss_fn` settings:
a torch loss callable cannot run inside a jitted JAX step. Same formulas, same metrics; the tests
compare both on the same inputs."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from dockyard.config.schema.loss import LossConfig
from dockyard.policy.jax.settings import LOSSES
from dockyard.policy.samples import PolicySetupError


class LossSettings(NamedTuple):
    """The loss_fn fields the JAX loss reads: hashable, so a jitted step is compiled once per setting."""

    name: str
    ratio_clip_min: float
    ratio_clip_max: float
    ratio_clip_c: float | None
    loss_agg_mode: str
    entropy_coef: float
    kl_penalty: float
    kl_type: str
    use_unbiased_kl: bool

    @classmethod
    def of_loss(cls, loss_fn, config: LossConfig) -> "LossSettings":
        """The settings of the loss component a loop passes (its `config`), or the SFT loss (`kind` nll)
        aggregated as `config` says."""
        if getattr(loss_fn, "kind", None) == "nll":
            return cls("nll", 0.0, 0.0, None, config.loss_agg_mode, 0.0, 0.0, "k1", False)
        return cls.of(loss_fn.config)

    @classmethod
    def of(cls, config: LossConfig) -> "LossSettings":
        if config.name not in LOSSES:
            raise PolicySetupError(f"loss_fn.name: {config.name!r} has no JAX implementation; the jax backend "
                                   f"trains with {', '.join(LOSSES)}")
        if config.reference_policy_kl_type not in KL_ESTIMATORS:
            raise PolicySetupError(f"loss_fn.reference_policy_kl_type: {config.reference_policy_kl_type!r} has no "
                                   f"JAX implementation; the jax backend knows {', '.join(KL_ESTIMATORS)}")
        in_loss = config.reference_policy_kl_penalty if not config.kl_in_reward else 0.0
        return cls(config.name, config.ratio_clip_min, config.ratio_clip_max, config.ratio_clip_c,
                   config.loss_agg_mode, config.entropy_coef, in_loss, config.reference_policy_kl_type,
                   config.use_unbiased_kl)


def _k1(logprobs, ref):
    return logprobs - ref


def _k2(logprobs, ref):
    return 0.5 * jnp.square(logprobs - ref)


def _k3(logprobs, ref):
    log_ratio = logprobs - ref
    return jnp.exp(jnp.minimum(-log_ratio, 20.0)) + log_ratio - 1


KL_ESTIMATORS = {"k1": _k1, "k2": _k2, "k3": _k3}


def per_token_loss(s: LossSettings, logprobs, old, advantages, mask, ref=None, entropy=None):
    """Per-token losses [B, T] and per-token metrics (no gradient), as the torch loss `s.name` gives."""
    if s.name == "nll":
        return -logprobs, {}
    if s.name == "gspo":
        m = mask.astype(logprobs.dtype)
        seq_log_ratio = jnp.clip(((logprobs - old) * m).sum(axis=1) / jnp.maximum(m.sum(axis=1), 1.0), -20, 20)
        ratio = jnp.broadcast_to(jnp.exp(seq_log_ratio)[:, None], logprobs.shape)
        token_ratio = jnp.exp(jnp.clip(logprobs - old, -20, 20))
        log_ratio = jnp.clip(logprobs - old, -20, 20)
    else:
        log_ratio = jnp.clip(logprobs - old, -20, 20)
        ratio = token_ratio = jnp.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * jnp.clip(ratio, 1 - s.ratio_clip_min, 1 + s.ratio_clip_max)
    loss = jnp.maximum(unclipped, clipped)
    if s.name == "clipped_pg" and s.ratio_clip_c is not None:
        loss = jnp.where(advantages < 0, jnp.minimum(loss, -advantages * s.ratio_clip_c), loss)
    metrics = {"clip_fraction": (clipped > unclipped).astype(jnp.float32),
               "approx_kl_old": jax.lax.stop_gradient(-log_ratio)}
    if ref is not None and s.kl_penalty > 0:
        kl = KL_ESTIMATORS[s.kl_type](logprobs, ref)
        if s.use_unbiased_kl:
            kl = kl * token_ratio
        loss = loss + s.kl_penalty * kl
        metrics["kl_ref"] = jax.lax.stop_gradient(kl)
    if entropy is not None:
        if s.entropy_coef > 0:
            loss = loss - s.entropy_coef * entropy
        metrics["entropy"] = jax.lax.stop_gradient(entropy)
    return loss, metrics


def aggregate(per_token, mask, mode: str, total_tokens, total_sequences):
    """This micro-batch's share of the step loss (totals count the whole optimizer step)."""
    m = mask.astype(per_token.dtype)
    if mode == "token-mean":
        return (per_token * m).sum() / jnp.maximum(total_tokens, 1.0)
    per_sequence = (per_token * m).sum(axis=1) / jnp.maximum(m.sum(axis=1), 1.0)
    return per_sequence.sum() / jnp.maximum(total_sequences, 1.0)
