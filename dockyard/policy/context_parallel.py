"""Context parallelism for the dtensor backend: the ranks of a CP group share one set of sequences
and each runs the model on its own slice of their positions.

Design (the all-gather-K/V form of CP): every attention layer gathers the keys and values of the
whole sequence from the group and attends its local queries to them under a mask built from global
positions. Activations, MLPs, norms and the LM head only ever see the local slice; what crosses
ranks per layer is K/V (heads_kv x head_dim per token), not the attention scores, and the attention
runs on torch SDPA, so it needs no device-specific ring kernel (it runs on CPU over gloo too).

Positions are dealt in 2 x CP chunks, rank r holding chunks r and 2CP-1-r, so each rank has the
same share of causal attention work (the standard load-balanced layout)."""

from __future__ import annotations

import torch
import torch.distributed as dist

from dockyard.errors import DockyardError
from dockyard.policy.tensor_parallel import SumOverRanks

ATTENTION_NAME = "dockyard_context_parallel"


class ContextParallelError(DockyardError, ValueError):
    """The model cannot be split over positions as configured (named before anything trains)."""


class _GatherSequence(torch.autograd.Function):
    """All-gather along the sequence dimension. Backward sums the gathered gradient over the group
    (each rank's queries attend to every rank's keys) and keeps this rank's slice."""

    @staticmethod
    def forward(ctx, tensor: torch.Tensor, group: dist.ProcessGroup, dim: int) -> torch.Tensor:
        ctx.group, ctx.dim, ctx.rank, ctx.length = group, dim, dist.get_rank(group), tensor.shape[dim]
        parts = [torch.empty_like(tensor) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, tensor.contiguous(), group=group)
        return torch.cat(parts, dim=dim)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        # all_reduce + slice rather than reduce_scatter: gloo has no reduce_scatter
        grad = grad.contiguous()
        dist.all_reduce(grad, group=ctx.group)
        return grad.narrow(ctx.dim, ctx.rank * ctx.length, ctx.length), None, None


class SequenceShards:
    """Which positions of a [B, width] batch this rank computes. `width` is padded on the left (as
    the policy pads its rows) to a multiple of 2 x CP."""

    def __init__(self, width: int, group: dist.ProcessGroup):
        self.group = group
        size, rank = dist.get_world_size(group), dist.get_rank(group)
        chunks = 2 * size
        self.width = -(-width // chunks) * chunks
        self.extra = self.width - width
        chunk = self.width // chunks

        def owned(r: int) -> torch.Tensor:
            return torch.cat([torch.arange(r * chunk, (r + 1) * chunk),
                              torch.arange((chunks - 1 - r) * chunk, (chunks - r) * chunk)])

        self.local = owned(rank)
        # the keys' order after an all-gather: rank 0's positions, then rank 1's, ...
        self.gathered = torch.cat([owned(r) for r in range(size)])

    def pad(self, batch: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.pad(batch, (self.extra, 0))

    def attention_mask(self, valid: torch.Tensor) -> torch.Tensor:
        """[B, 1, local, width] boolean mask: a local query sees the real tokens at or before it.
        A padding query sees itself only (SDPA gives NaN for a row that sees nothing)."""
        query, key = self.local[:, None], self.gathered[None, :]
        causal = key <= query
        allowed = causal[None] & valid[:, self.gathered][:, None, :]
        return (allowed | (key == query)[None])[:, None]

    def combine(self, values: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """[B, n] values this rank computed at global `positions` (some of its own) -> [B, width] for
        the whole sequence, on every rank of the group (zero where no rank computed one)."""
        full = values.new_zeros((values.shape[0], self.width))
        full = full.index_copy(1, positions.to(values.device), values)
        # each position has one owner, and every rank computes the same loss from the sum
        return SumOverRanks.apply(full, self.group)


def context_parallel_attention(group: dist.ProcessGroup):
    """An attention function (transformers' AttentionInterface) that gathers K and V of the whole
    sequence from the group, then runs transformers' SDPA attention with the caller's 4-D mask."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    def attention(module, query, key, value, attention_mask, **kwargs):
        key = _GatherSequence.apply(key, group, 2)
        value = _GatherSequence.apply(value, group, 2)
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)

    return attention


def use_context_parallel_attention(model: torch.nn.Module, group: dist.ProcessGroup, name: str) -> None:
    """Switch `model` to the gathering attention (registered for this process's one CP group)."""
    from transformers import AttentionInterface

    attention = getattr(model.config, "_attn_implementation", None)
    if attention != "sdpa":
        raise ContextParallelError(f"policy.dtensor_cfg.context_parallel_size: context-parallel attention runs on "
                                   f"torch SDPA; {name} loads with {attention!r} attention")
    AttentionInterface.register(ATTENTION_NAME, context_parallel_attention(group))
    model.set_attn_implementation(ATTENTION_NAME)
