"""`loss_fn`: the policy loss, reference KL and off-policy safeguards."""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import PositiveInt

from dockyard.config.fields import Section, component, field


class ReferenceModel(Section):
    hf_path: Optional[str] = field(None, "HF folder of the reference policy.",
                                   "With a KL penalty, this or checkpoint_path must be set.")
    checkpoint_path: Optional[str] = field(
        None, "One concrete dockyard checkpoint folder (<run>/step_<N>), preferred over hf_path.",
        "An unusable path fails the run at start-up; it never falls back to hf_path.")
    update_interval: int = field(0, "<= 0 keeps the reference frozen; N > 0 copies the current policy "
                                 "into it every N steps (moving reference).",
                                 "N > 0 needs a KL penalty to be on.")


class ImportanceSamplingCorrection(Section):
    enabled: bool = field(False, "Reweight by pi_old / pi_rollout to correct engine/trainer mismatch.",
                          "Mutually exclusive with use_rollout_logprobs.")
    level: Literal["token", "sequence", "geometric"] = field("token", "Weight granularity.")
    action: Literal["clip", "mask"] = field("clip", "Out-of-bound weights: clamp them, or drop the "
                                            "tokens from numerator and denominator.")
    lower_bound: Optional[float] = field(None, "Lower weight bound (suggested 0.5 token, 0.9999 geometric).",
                                         "Required when enabled; must be < upper_bound.", gt=0)
    upper_bound: Optional[float] = field(None, "Upper weight bound (suggested 2.0 token, 1.0001 geometric).",
                                         "Required when enabled.", gt=0)


class OPSMConfig(Section):
    enabled: bool = field(False, "Off-policy sequence masking: drop negative-advantage sequences whose "
                          "sequence KL to the sampler exceeds delta.", "Composable with IS correction and M2PO.")
    delta: float = field(0.1, "Sequence-level KL threshold.", gt=0)


class M2POConfig(Section):
    enabled: bool = field(False, "Mask the tokens with the largest (log pi_old/pi_rollout)^2 until the "
                          "second moment of the rest is below threshold.",
                          "Mutually exclusive with use_rollout_logprobs.")
    threshold: float = field(0.04, "Second-moment threshold.", gt=0)


class LossConfig(Section):
    name: component("loss") = field("clipped_pg", "Policy loss (see `dockyard list`).")
    ratio_clip_min: float = field(0.2, "Lower clip epsilon: ratios below 1 - ratio_clip_min are clipped.",
                                  ge=0, le=1)
    ratio_clip_max: float = field(0.28, "Upper clip epsilon (clip-higher when > ratio_clip_min).", ge=0)
    ratio_clip_c: Optional[float] = field(None, "Dual-clip bound for negative advantages; null disables it.",
                                          "Must be > 1; only for name: clipped_pg.", gt=1)
    loss_agg_mode: Literal["token-mean", "seq-mean-token-mean"] = field(
        "token-mean", "How per-token losses are averaged.")
    entropy_coef: float = field(0.0, "Subtract entropy_coef x entropy from the loss.", ge=0)
    reference_policy_kl_penalty: float = field(0.0, "Coefficient of KL(pi || pi_ref); 0 turns the "
                                               "reference model off.", ge=0)
    reference_policy_kl_type: component("kl_estimator") = field("k3", "KL estimator (see `dockyard list`).")
    use_unbiased_kl: bool = field(False, "Weight per-token KL by exp(logp - old_logp) (DeepSeek-V3.2).")
    kl_in_reward: bool = field(False, "Subtract the KL from the reward instead of adding it to the loss.")
    reference_model: ReferenceModel = field(ReferenceModel, "Where the reference policy comes from.")
    use_rollout_logprobs: bool = field(False, "Use the engine's sampling logprobs as old logprobs instead "
                                       "of recomputing them on the trainer.",
                                       "Mutually exclusive with is_correction and m2po.")
    is_correction: ImportanceSamplingCorrection = field(ImportanceSamplingCorrection,
                                                        "Importance-sampling correction.")
    opsm: OPSMConfig = field(OPSMConfig, "Off-policy sequence masking.")
    m2po: M2POConfig = field(M2POConfig, "Second-moment trust policy optimisation.")
    ppo_epochs: PositiveInt = field(1, "Passes over each batch of trajectories.")
