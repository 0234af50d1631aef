"""What the generation backends and the environments can take as input."""

from __future__ import annotations

from typing import Iterator

from dockyard.config.constraints.registry import rule
from dockyard.config.errors import Problem
from dockyard.config.schema import MasterConfig


@rule
def multimodal_inputs(cfg: MasterConfig) -> Iterator[Problem]:
    """Image inputs need a backend that forwards them: vLLM. SGLang's client does not yet,
    and the embedded engine serves text-only models."""
    gen = cfg.policy.generation
    if gen.allow_multimodal_inputs and gen.backend == "sglang":
        yield Problem("policy.generation.allow_multimodal_inputs", "the sglang backend does not forward images "
                      "yet; use backend vllm or turn image inputs off")
    if gen.allow_multimodal_inputs and gen.backend == "embedded":
        yield Problem("policy.generation.allow_multimodal_inputs", "the embedded engine serves text-only "
                      "models; use backend vllm or turn image inputs off")


@rule
def screenshots_need_image_inputs(cfg: MasterConfig) -> Iterator[Problem]:
    """An environment that shows the agent screenshots needs the multimodal gate open."""
    observation = (cfg.env.model_extra or {}).get("observation_type")
    if isinstance(observation, str) and "screenshot" in observation and not cfg.policy.generation.allow_multimodal_inputs:
        yield Problem("env.observation_type", f"{observation} shows the model screenshots: set "
                      "policy.generation.allow_multimodal_inputs=true (with a vision-language policy and "
                      "generation backend vllm)")
    turns, most = cfg.grpo.max_rollout_turns, cfg.policy.generation.max_images_per_sample
    if isinstance(observation, str) and "screenshot" in observation and most < turns:
        yield Problem("policy.generation.max_images_per_sample", f"{most}, but an episode of grpo.max_rollout_turns "
                      f"({turns}) turns carries up to {turns} screenshots (the first and one after each reply but the "
                      "last); raise it or lower the turns")


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
