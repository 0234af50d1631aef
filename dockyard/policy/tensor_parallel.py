"""Tensor parallelism for the dtensor backend: the architecture's own TP plan (transformers publishes
one per model family as `config.base_model_tp_plan`) applied with torch's DTensor `parallelize_module`,
the embedding and LM head split over the vocabulary, and logprobs / entropy computed from the
vocabulary-sharded logits without gathering them."""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from dockyard.errors import DockyardError

# transformers' plan words this backend can apply; any other word in a plan is refused by name
_STYLES = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}
# weights every TP rank holds whole but that see only the rank's heads (Qwen3's q_norm / k_norm):
# their gradients are partial per rank and are summed over the TP group after backward
_REPLICATED_PARTIAL_GRAD = "replicated_with_grad_allreduce"


class TensorParallelError(DockyardError, ValueError):
    """The model cannot be split as asked (named before anything trains)."""


@dataclass(frozen=True)
class VocabShard:
    """This rank's slice [start, start + size) of the vocabulary in the LM head's output."""

    start: int
    size: int
    group: dist.ProcessGroup


def layer_plan(config, size: int, name: str) -> dict[str, str]:
    """The architecture's TP plan for its decoder layers ("layers.*.<module>" -> style), checked
    against what this backend applies and what `size` ranks can split (`config`: the model's
    transformers config; the preflight calls this before the queue)."""
    architecture = getattr(config, "model_type", type(config).__name__)
    # the embedding and the LM head are split by apply_tensor_parallel itself (over the vocabulary)
    plan = {pattern: style for pattern, style in (getattr(config, "base_model_tp_plan", None) or {}).items()
            if pattern.startswith("layers.*.")}
    if not plan:
        raise TensorParallelError(f"policy.dtensor_cfg.tensor_parallel_size: {name} is a {architecture!r} model, "
                                  "and transformers publishes no tensor-parallel plan for it (base_model_tp_plan); "
                                  "use tensor_parallel_size 1 (FSDP data parallel) or a Llama/Qwen/Mistral-family model")
    unknown = sorted({style for style in plan.values() if style not in _STYLES and style != _REPLICATED_PARTIAL_GRAD})
    if unknown:
        raise TensorParallelError(f"policy.dtensor_cfg.tensor_parallel_size: the {architecture!r} plan uses "
                                  f"{', '.join(unknown)} for its decoder layers, which this backend does not apply yet "
                                  "(MoE experts, packed projections); use tensor_parallel_size 1")
    heads = {"num_attention_heads": config.num_attention_heads,
             "num_key_value_heads": getattr(config, "num_key_value_heads", None) or config.num_attention_heads,
             "intermediate_size": config.intermediate_size}
    for field, count in heads.items():
        if count % size:
            raise TensorParallelError(f"policy.dtensor_cfg.tensor_parallel_size: {name} has {field} = {count}, "
                                      f"which {size} ranks cannot split evenly")
    return plan


def apply_tensor_parallel(model: torch.nn.Module, mesh: DeviceMesh, name: str) -> set[str]:
    """Split `model` over the 1-D TP `mesh` in place. Returns the names of the parameters whose
    gradients must be summed over the TP group after backward (see _REPLICATED_PARTIAL_GRAD); names,
    since FSDP replaces the parameter objects afterwards."""
    plan = layer_plan(model.config, mesh.size(), name)
    inner = model.model
    partial_grad: set[str] = set()
    for index, layer in enumerate(inner.layers):
        styles = {}
        for pattern, style in plan.items():
            path = pattern.removeprefix("layers.*.")
            if style == _REPLICATED_PARTIAL_GRAD:
                partial_grad |= {f"model.layers.{index}.{path}.{p}" for p, _ in layer.get_submodule(path).named_parameters()}
            else:
                styles[path] = _STYLES[style]()
        parallelize_module(layer, mesh, styles)
    tied = model.lm_head.weight is inner.embed_tokens.weight
    # both split the vocabulary (dim 0 of their weights), so a tied pair stays one tensor
    parallelize_module(inner.embed_tokens, mesh, RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate()))
    parallelize_module(model.lm_head, mesh, ColwiseParallel(output_layouts=Shard(-1), use_local_output=True))
    if tied:
        model.lm_head.weight = inner.embed_tokens.weight
    return partial_grad


def vocab_shard(model: torch.nn.Module, mesh: DeviceMesh) -> VocabShard:
    """Where this rank's LM-head rows sit in the vocabulary (DTensor's Shard(0): torch.chunk's split)."""
    weight = model.lm_head.weight
    vocab = weight.shape[0]
    chunk = -(-vocab // mesh.size())
    start = min(vocab, chunk * mesh.get_local_rank())
    size = min(chunk, vocab - start)
    if weight.to_local().shape[0] != size:   # torch changed how Shard splits: the offsets would be wrong
        raise TensorParallelError(f"the LM head holds {weight.to_local().shape[0]} vocabulary rows on this rank, "
                                  f"expected {size}")
    return VocabShard(start, size, mesh.get_group())


class SumOverRanks(torch.autograd.Function):
    """All-reduce (sum) whose backward is the identity: every rank of the group (TP or CP) computes the
    same loss from the summed value, so each rank's own share of the input gets the gradient once (a
    summed backward would count it once per rank)."""

    @staticmethod
    def forward(ctx, tensor: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        out = tensor.clone()
        dist.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad, None


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float, with_entropy: bool,
                   shard: VocabShard | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log p(target) and the entropy at each position of `logits` [..., V] (or [..., V / TP] with a
    `shard`: only scalars per position cross ranks)."""
    logits = logits.float() / temperature
    if shard is None:
        log_softmax = torch.log_softmax(logits, dim=-1)
        picked = log_softmax.gather(-1, targets[..., None])[..., 0]
        entropy = -(log_softmax.exp() * log_softmax).sum(-1) if with_entropy else None
        return picked, entropy
    peak = logits.detach().max(-1).values
    dist.all_reduce(peak, op=dist.ReduceOp.MAX, group=shard.group)
    shifted = logits - peak[..., None]
    exp = shifted.exp()
    log_total = SumOverRanks.apply(exp.sum(-1), shard.group).log()
    local_target = targets - shard.start
    here = (local_target >= 0) & (local_target < shard.size)
    target_logit = shifted.gather(-1, local_target.clamp(0, shard.size - 1)[..., None])[..., 0] * here
    picked = SumOverRanks.apply(target_logit, shard.group) - log_total
    entropy = None
    if with_entropy:   # H = log Z - E_p[shifted logit]
        expected = SumOverRanks.apply((exp * shifted).sum(-1), shard.group) / log_total.exp()
        entropy = log_total - expected
    return picked, entropy


def sum_partial_gradients(parameters: list[torch.nn.Parameter], group: dist.ProcessGroup) -> None:
    for parameter in parameters:
        if parameter.grad is not None:
            grad = parameter.grad
            dist.all_reduce(grad.to_local() if hasattr(grad, "to_local") else grad, group=group)


def clip_gradients(parameters: list[torch.nn.Parameter], max_norm: float) -> torch.Tensor:
    """torch's clip_grad_norm_ for parameters on different meshes (TP-split weights are 2-D DTensors,
    the rest 1-D over data parallel), which its single stack cannot mix: each norm is made whole
    first, then one factor scales every gradient."""
    grads = [p.grad for p in parameters if p.grad is not None]
    squares = torch.zeros((), dtype=torch.float64)
    for grad in grads:
        norm = torch.linalg.vector_norm(grad, 2)
        norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm
        squares += norm.double().cpu() ** 2
    total = squares.sqrt()
    factor = max_norm / (float(total) + 1e-6)
    if factor < 1.0:
        for grad in grads:
            grad.mul_(factor)
    return total.float()


def quiet_tensor_parallel_warnings() -> None:
    """DTensor warns on every gather over both mesh dimensions (the weights a refit or checkpoint
    export sends, the gradient norm) that one flattened collective would be faster, and FSDP that the
    LM head's vocabulary-sharded output is a view; neither is on a hot path or unsafe here (nothing
    writes into the logits in place), and once per step they would bury the run's own log."""
    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view tensor")
