"""Training and serving precision."""

from __future__ import annotations

from typing import Iterator

from dockyard.config.constraints.registry import rule
from dockyard.config.errors import Problem
from dockyard.config.schema import MasterConfig


@rule
def precision(cfg: MasterConfig) -> Iterator[Problem]:
    """megatron bf16 / fp16 are exclusive and agree with policy.precision; fp8 needs bf16 or fp16, fp8_param needs fp8; fp8 serving needs GPUs and non-fp32 training."""
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
