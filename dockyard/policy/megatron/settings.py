"""`policy.megatron_cfg` -> megatron-core's own config objects, and what of it is not built.

The named fields map as the seed's `megatron.model` / `ddp_config` / `optimizer` do; any other
field is forwarded by name to the upstream class that has it (TransformerConfig,
DistributedDataParallelConfig or OptimizerConfig) and refused by name when none has it or when
the class rejects its value. The model's structure comes from the HF folder, not from here."""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F

from dockyard.config.errors import Problem
from dockyard.config.fields import changed_fields
from dockyard.config.schema import MasterConfig
from dockyard.policy.samples import PolicySetupError

# set by dockyard from the model folder and the policy section: a user value would contradict them
_DERIVED = {"num_layers", "hidden_size", "num_attention_heads", "num_query_groups", "kv_channels", "ffn_hidden_size",
            "normalization", "layernorm_epsilon", "gated_linear_unit", "activation_func", "add_bias_linear",
            "add_qkv_bias", "qk_layernorm", "params_dtype", "lr", "weight_decay", "adam_beta1", "adam_beta2",
            "adam_eps", "clip_grad", "optimizer", "sgd_momentum", "hidden_dropout", "attention_dropout",
            "pipeline_dtype",
            "variable_seq_lengths", "num_moe_experts", "moe_router_topk", "moe_ffn_hidden_size",
            "moe_router_pre_softmax", "expert_model_parallel_size"}
_PRECISION = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def unbuilt(cfg: MasterConfig) -> list[Problem]:
    """What the megatron backend does not build yet, by name (the preflight and the backend call it)."""
    if cfg.policy.backend != "megatron" or cfg.policy.megatron_cfg is None:
        return []
    m, policy = cfg.policy.megatron_cfg, cfg.policy
    problems = []
    for name, value, what in (
            ("context_parallel_size", m.context_parallel_size > 1, "context parallelism (megatron-core's local "
             "attention refuses it: only transformer-engine's attention splits the sequence, and that layer spec "
             "is not wired)"),
            ("expert_tensor_parallel_size", m.expert_tensor_parallel_size is not None, "expert tensor parallelism"),
            ("fp8", m.fp8 is not None, "FP8 training (transformer-engine, GPUs)"),
            ("optimizer_cpu_offload", m.optimizer_cpu_offload, "optimizer CPU offload")):
        if value:
            problems.append(Problem(f"policy.megatron_cfg.{name}", f"{what} is not built for the megatron backend "
                                    "yet; use the default"))
    if policy.optimizer.name == "sgd" and m.use_distributed_optimizer:
        problems.append(Problem("policy.optimizer.name", "megatron-core's distributed optimizer shards Adam only "
                                "(its checkpoint format); with sgd set policy.megatron_cfg.use_distributed_optimizer "
                                "false"))
    if policy.lora.enabled:
        problems.append(Problem("policy.lora.enabled", "LoRA is not built for the megatron backend; use dtensor"))
    for name in changed_fields(cfg.policy.dtensor_cfg):
        problems.append(Problem(f"policy.dtensor_cfg.{name}", "a dtensor setting, which the megatron backend does "
                                "not read; set its megatron_cfg counterpart (e.g. tensor_model_parallel_size, "
                                "recompute_granularity) instead"))
    problems += [Problem(f"policy.megatron_cfg.{name}", message) for name, message in _unknown_fields(cfg)]
    return problems


def _upstream_classes():
    from dockyard.policy.megatron.cpu import quiet_import

    with quiet_import():
        from megatron.core.distributed import DistributedDataParallelConfig
        from megatron.core.optimizer import OptimizerConfig
        from megatron.core.transformer.transformer_config import TransformerConfig
    return TransformerConfig, DistributedDataParallelConfig, OptimizerConfig


def _extra(cfg: MasterConfig) -> dict:
    return dict(cfg.policy.megatron_cfg.model_extra or {})


def _unknown_fields(cfg: MasterConfig) -> list[tuple[str, str]]:
    extra = _extra(cfg)
    if not extra:
        return []
    classes = _upstream_classes()
    known = {f.name for cls in classes for f in dataclasses.fields(cls)}
    out = []
    for name in sorted(extra):
        if name in _DERIVED:
            out.append((name, "set by dockyard from the model folder and the policy section (policy.optimizer, "
                              "policy.max_grad_norm, policy.precision); remove it"))
        elif name not in known:
            out.append((name, f"no field of megatron-core's {', '.join(c.__name__ for c in classes)} has this name"))
    return out


def _split(extra: dict, cls) -> dict:
    names = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in extra.items() if k in names}


def _pipeline_settings(m, dtype) -> dict:
    """Pipeline stages exchange activations of each micro-batch's own shape (rows and widths vary with
    the samples; megatron refuses variable shapes with its default MoE dispatcher even in a dense model).
    Interleaved model chunks cannot: two stages then send shapes both ways at once, which megatron does
    not order, so the policy pads a step's micro-batches to one shape. Point-to-point sends one at a
    time (batch_p2p_comm false) unless megatron_cfg forwards it."""
    if m.pipeline_model_parallel_size == 1:
        return {}
    settings = {"pipeline_model_parallel_size": m.pipeline_model_parallel_size, "pipeline_dtype": dtype,
                "virtual_pipeline_model_parallel_size": m.virtual_pipeline_model_parallel_size,
                "batch_p2p_comm": False}
    if m.virtual_pipeline_model_parallel_size is None:
        settings.update(variable_seq_lengths=True, moe_token_dispatcher_type="alltoall")
    return settings


def _expert_settings(m, shape) -> dict:
    """A mixture of experts as the HF model computes it: each token's top-k experts by router logit,
    their probabilities a softmax over all experts (renormalised over the k when the model's
    norm_topk_prob says so: the same as a softmax over the k logits), no capacity limit (no token
    dropped), and no load-balancing loss (the HF model adds its auxiliary loss only with
    output_router_logits; megatron_cfg may forward moe_router_load_balancing_type and
    moe_aux_loss_coeff). Tokens move between expert-parallel ranks with megatron's all-to-all
    dispatcher."""
    if not shape.experts:
        return {}
    return {"num_moe_experts": shape.experts, "moe_router_topk": shape.experts_per_token,
            "moe_ffn_hidden_size": shape.expert_ffn, "moe_router_pre_softmax": not shape.renormalise_topk,
            "moe_router_load_balancing_type": "none", "moe_token_dispatcher_type": "alltoall",
            "expert_model_parallel_size": m.expert_model_parallel_size}


def upstream_settings(cfg: MasterConfig, shape, trainable: bool):
    """(TransformerConfig, DistributedDataParallelConfig, OptimizerConfig) for this run."""
    TransformerConfig, DDPConfig, OptimizerConfig = _upstream_classes()
    m, policy = cfg.policy.megatron_cfg, cfg.policy
    extra = _extra(cfg)
    dtype = _PRECISION[policy.precision]

    def build(cls, **kwargs):
        fields = _split(extra, cls)
        try:
            return cls(**{**kwargs, **fields})
        except (TypeError, ValueError, AssertionError) as err:
            names = ", ".join(sorted(fields)) or "its settings"
            raise PolicySetupError(f"policy.megatron_cfg: megatron-core's {cls.__name__} refused {names}: "
                                   f"{err}") from None

    from dockyard.policy.megatron.cpu import quiet_import

    # megatron trains experts beside TP only with sequence parallelism, whose norms its local layer
    # spec does not build (transformer-engine's do; that spec is not wired here)
    if extra.get("sequence_parallel"):
        raise PolicySetupError("policy.megatron_cfg.sequence_parallel: megatron-core's local layer spec (the one "
                               "dockyard builds; transformer-engine's is not wired yet) has no sequence-parallel "
                               "norms; remove it")
    if shape.experts and m.tensor_model_parallel_size > 1:
        raise PolicySetupError(f"policy.megatron_cfg.tensor_model_parallel_size {m.tensor_model_parallel_size}: "
                               "megatron-core trains a mixture of experts beside tensor parallelism only with "
                               "sequence parallelism, which its local layer spec does not build; split the "
                               "experts with expert_model_parallel_size instead")
    with quiet_import():
        transformer = build(
            TransformerConfig, num_layers=shape.layers, hidden_size=shape.hidden, num_attention_heads=shape.heads,
            num_query_groups=shape.kv_heads, kv_channels=shape.head_dim, ffn_hidden_size=shape.ffn,
            normalization="RMSNorm", layernorm_epsilon=shape.norm_eps, gated_linear_unit=True, activation_func=F.silu,
            add_bias_linear=False, add_qkv_bias=shape.qkv_bias, qk_layernorm=shape.qk_norm, hidden_dropout=0.0,
            attention_dropout=0.0, use_cpu_initialization=True, params_dtype=dtype, bf16=m.bf16, fp16=m.fp16,
            tensor_model_parallel_size=m.tensor_model_parallel_size,
            **_pipeline_settings(m, dtype) | _expert_settings(m, shape),
            # the fused kernels are CUDA builds; the plain torch paths compute the same (and the fused
            # causal softmax would ignore the block mask of shared-prompt rows)
            bias_activation_fusion=False, bias_dropout_fusion=False, apply_rope_fusion=False,
            masked_softmax_fusion=False, persist_layer_norm=False, gradient_accumulation_fusion=False)
    if not trainable:
        return transformer, None, None
    ddp = build(DDPConfig, use_distributed_optimizer=m.use_distributed_optimizer,
                grad_reduce_in_fp32=m.grad_reduce_in_fp32)
    opt = policy.optimizer
    adam = opt.name == "adamw"
    optimizer = build(OptimizerConfig, optimizer="adam" if adam else "sgd", lr=opt.lr, weight_decay=opt.weight_decay,
                      adam_beta1=opt.betas[0], adam_beta2=opt.betas[1], adam_eps=opt.eps,
                      sgd_momentum=0.0,   # policy.optimizer's sgd is plain SGD, as the dtensor backend's
                      clip_grad=policy.max_grad_norm, use_distributed_optimizer=m.use_distributed_optimizer,
                      bf16=m.bf16, fp16=m.fp16, params_dtype=dtype)
    return transformer, ddp, optimizer
