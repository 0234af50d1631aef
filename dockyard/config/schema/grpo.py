"""`grpo`: the RL loop: group shape, advantages, sampling, async pipeline, validation cadence."""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import NonNegativeInt, PositiveInt

from dockyard.config.fields import OpenSection, Section, component, field


class AdvantageEstimator(OpenSection):
    """Extra keys are passed to the estimator's constructor; one it does not take is refused by name."""

    name: component("advantage_estimator") = field("grpo", "Advantage estimator (see `dockyard list`).",
                                                   "opd needs on_policy_distillation and async_grpo.")
    norm_mode: Literal["none", "group_mean", "group_zscore", "batch_mean", "batch_zscore"] = field(
        "group_zscore", "Reward normalisation.", "group_* modes refuse unequal group sizes.")
    epsilon: float = field(1.0e-6, "Added to the standard deviation in z-score modes.", gt=0)


class RewardScaling(Section):
    enabled: bool = field(False, "Linearly map rewards from [source_min, source_max] to [target_min, target_max].",
                          "Refused by async GRPO.")
    source_min: float = field(0.0, "Lowest raw reward.")
    source_max: float = field(1.0, "Highest raw reward.", "Must be > source_min.")
    target_min: float = field(0.0, "Mapped lowest reward.")
    target_max: float = field(1.0, "Mapped highest reward.")


class RewardShaping(Section):
    enabled: bool = field(False, "Penalise over-long responses (DAPO overlong shaping).", "Refused by async GRPO.")
    overlong_buffer_length: PositiveInt = field(128, "Tokens before the length limit where the penalty ramps in.")
    overlong_penalty: float = field(1.0, "Penalty at the length limit.", ge=0)


class SamplerConfig(Section):
    dynamic_sampling: bool = field(False, "Keep sampling until num_prompts_per_step groups survive the filters "
                                   "(refill = missing groups x refill_ratio prompts per round).",
                                   "Refused by async GRPO.")
    num_oversample: NonNegativeInt = field(0, "Extra prompt groups sampled per step; groups beyond "
                                           "num_prompts_per_step that survive the filters are discarded.",
                                           "Must be 0 with async GRPO (use max_staleness_steps).")
    refill_ratio: float = field(2.0, "Refill amplification: refill = missing groups x refill_ratio.", ge=1)
    max_refill_count: PositiveInt = field(256, "Most prompts in one refill.")
    max_refill_rounds: NonNegativeInt = field(8, "Most refills in one step; after them the step trains on "
                                              "the groups it has (and says so).")
    rollout_timeout_s: float = field(7200.0, "Longest wait for one rollout before it is aborted.", gt=0)


class FilterConfig(Section):
    status: bool = field(True, "Drop a group if any of its trajectories FAILED.")
    identical_reward: bool = field(False, "Drop groups whose trajectories all have the same reward.")


class AsyncGRPOConfig(Section):
    enabled: bool = field(False, "Generate and train concurrently on disjoint resources.",
                          "Needs cluster.colocate false, run_mode default, sampler.num_oversample 0, "
                          "one dataset and loss_fn.is_correction; refuses dynamic sampling and reward "
                          "scaling/shaping.")
    max_staleness_steps: float = field(0.0, "Extra pipeline capacity in training steps: "
                                       "capacity = int(B x (1 + max_staleness_steps)); a group that would be trained "
                                       "more than ceil(max_staleness_steps) weight versions after it started is "
                                       "dropped and its prompt sampled again (docs/async.md).", ge=0)
    sliding_window: Literal["no-window", "window-gated", "windowed-fifo"] = field(
        "no-window", "How prompt groups are dispatched and collected (docs/async.md#sliding-windows).")
    partial_rollout: bool = field(False, "Abort in-flight generations when new weights arrive and continue them "
                                  "with the new weights, keeping the tokens already generated.")
    mask_offpolicy_in_partial_rollout: bool = field(False, "Give loss_mask 0 to resumed tokens generated "
                                                    "under older weights.", "Needs partial_rollout.")


class GRPOConfig(Section):
    num_prompts_per_step: PositiveInt = field(..., "Prompt groups per step (B).")
    num_generations_per_prompt: PositiveInt = field(..., "Trajectories per prompt (N, the group size).")
    max_num_steps: PositiveInt = field(..., "Training steps.")
    max_num_epochs: PositiveInt = field(1, "Passes over the training data (the run stops at whichever "
                                        "of max_num_steps / max_num_epochs comes first; with several datasets, "
                                        "when each has been drawn this often). The preflight notes the step "
                                        "at which the epochs end the run.")
    max_rollout_turns: PositiveInt = field(1, "Model turns per trajectory.", "> 1 needs env.agent.")
    run_mode: Literal["default", "train_only", "rollout_only"] = field(
        "default", "default: rollout + train; train_only: train on rollouts saved under rollout_data_path; "
        "rollout_only: sample and save only.")
    rollout_data_path: str = field("./rollout_data", "Rollout output (rollout_only) or input (train_only).")
    skip_prev_logprobs: bool = field(False, "Skip the previous-policy logprob pass; prev_logprobs are then "
                                     "zero-filled (strictly on-policy single-epoch losses only).",
                                     "Refused by OPD, whose advantage subtracts prev_logprobs.")
    adv_estimator: AdvantageEstimator = field(AdvantageEstimator, "Advantage estimator.")
    reward_scaling: RewardScaling = field(RewardScaling, "Reward scaling.")
    reward_shaping: RewardShaping = field(RewardShaping, "Reward shaping.")
    invalid_action_penalty: float = field(0.0, "Reward added to a turn whose tool call could not be parsed "
                                          "(use a value <= 0).", le=0)
    sampler: SamplerConfig = field(SamplerConfig, "Prompt sampler.")
    filters: FilterConfig = field(FilterConfig, "Group filters.")
    retry_limit: PositiveInt = field(3, "Attempts per trajectory (including the first) before it FAILS.")
    async_grpo: AsyncGRPOConfig = field(AsyncGRPOConfig, "Asynchronous GRPO.")
    val_period: NonNegativeInt = field(0, "Validate every N steps; 0 disables validation.",
                                       "> 0 needs data.validation.")
    val_at_start: bool = field(False, "Validate before the first step.", "Needs data.validation.")
    max_val_samples: Optional[PositiveInt] = field(None, "Cap on validation prompts; null uses them all.")
