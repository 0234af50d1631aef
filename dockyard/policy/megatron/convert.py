"""HF decoder weights <-> megatron-core GPTModel weights, per tensor-parallel rank.

Llama, Qwen2 (q/k/v biases) and Qwen3 (q/k norms) lay their attention out as separate q, k, v
projections and their MLP as gate, up, down. megatron-core fuses q, k and v into `linear_qkv`,
grouped per key/value head ([q heads of group 0, k 0, v 0, q heads of group 1, ...]) so that a
tensor-parallel rank holds whole groups, and gate and up into `linear_fc1` ([gate shard; up shard]
on each rank). Column-parallel weights split their output rows over TP, row-parallel ones
(`linear_proj`, `linear_fc2`) their input columns; the embedding and the output layer split the
vocabulary. A mixture of experts (Qwen3-MoE) keeps its router (`mlp.gate` -> `mlp.router`, whole on
every rank) and each expert's MLP as a dense one (`mlp.experts.E.*` ->
`mlp.experts.local_experts.E.*`, split over TP the same way); the experts themselves split over the
expert-parallel ranks (`expert_share` / `all_experts`)."""

from __future__ import annotations

import torch

from dockyard.policy.decoder_shape import DecoderShape

def _rows(tensor: torch.Tensor, tp: int, rank: int) -> torch.Tensor:
    return tensor.chunk(tp, 0)[rank]


def _columns(tensor: torch.Tensor, tp: int, rank: int) -> torch.Tensor:
    return tensor.chunk(tp, 1)[rank]


def _grouped_qkv(shape: DecoderShape, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """[kv_heads, (heads / kv_heads + 2) * head_dim, ...] from the separate projections (weights or biases)."""
    per_group = shape.heads // shape.kv_heads
    tail = q.shape[1:]
    return torch.cat([q.reshape(shape.kv_heads, per_group * shape.head_dim, *tail),
                      k.reshape(shape.kv_heads, shape.head_dim, *tail),
                      v.reshape(shape.kv_heads, shape.head_dim, *tail)], dim=1)


def to_megatron(hf: dict[str, torch.Tensor], shape: DecoderShape, tp: int, rank: int) -> dict[str, torch.Tensor]:
    """This TP rank's GPTModel state dict from a full HF state dict."""
    out = {"embedding.word_embeddings.weight": _rows(hf["model.embed_tokens.weight"], tp, rank),
           "decoder.final_layernorm.weight": hf["model.norm.weight"]}
    if not shape.tied:
        out["output_layer.weight"] = _rows(hf["lm_head.weight"], tp, rank)
    for i in range(shape.layers):
        h, m = f"model.layers.{i}.", f"decoder.layers.{i}."
        attention = h + "self_attn."
        qkv = _grouped_qkv(shape, *(hf[f"{attention}{p}_proj.weight"] for p in "qkv"))
        out[m + "self_attention.linear_qkv.weight"] = _rows(qkv, tp, rank).reshape(-1, shape.hidden)
        if shape.qkv_bias:
            bias = _grouped_qkv(shape, *(hf[f"{attention}{p}_proj.bias"] for p in "qkv"))
            out[m + "self_attention.linear_qkv.bias"] = _rows(bias, tp, rank).reshape(-1)
        if shape.qk_norm:
            out[m + "self_attention.q_layernorm.weight"] = hf[attention + "q_norm.weight"]
            out[m + "self_attention.k_layernorm.weight"] = hf[attention + "k_norm.weight"]
        out[m + "self_attention.linear_proj.weight"] = _columns(hf[attention + "o_proj.weight"], tp, rank)
        out[m + "input_layernorm.weight"] = hf[h + "input_layernorm.weight"]
        out[m + "pre_mlp_layernorm.weight"] = hf[h + "post_attention_layernorm.weight"]
        mlps = [(h + "mlp.", m + "mlp.")]
        if shape.experts:
            out[m + "mlp.router.weight"] = hf[h + "mlp.gate.weight"]
            mlps = [(f"{h}mlp.experts.{e}.", f"{m}mlp.experts.local_experts.{e}.") for e in range(shape.experts)]
        for hf_mlp, mlp in mlps:
            out[mlp + "linear_fc1.weight"] = torch.cat([_rows(hf[hf_mlp + "gate_proj.weight"], tp, rank),
                                                        _rows(hf[hf_mlp + "up_proj.weight"], tp, rank)])
            out[mlp + "linear_fc2.weight"] = _columns(hf[hf_mlp + "down_proj.weight"], tp, rank)
    return out


def to_hf(shards: list[dict[str, torch.Tensor]], shape: DecoderShape) -> dict[str, torch.Tensor]:
    """The full HF state dict (tied lm_head left out) from every TP rank's GPTModel state dict, in rank order."""
    first = shards[0]

    def rows(name):
        return torch.cat([s[name] for s in shards], 0)

    def columns(name):
        return torch.cat([s[name] for s in shards], 1)

    out = {"model.embed_tokens.weight": rows("embedding.word_embeddings.weight"),
           "model.norm.weight": first["decoder.final_layernorm.weight"]}
    if not shape.tied:
        out["lm_head.weight"] = rows("output_layer.weight")
    per_group = shape.heads // shape.kv_heads
    q_rows = per_group * shape.head_dim
    for i in range(shape.layers):
        h, m = f"model.layers.{i}.", f"decoder.layers.{i}."
        attention = h + "self_attn."
        for kind in ("weight", "bias") if shape.qkv_bias else ("weight",):
            grouped = rows(f"{m}self_attention.linear_qkv.{kind}").reshape(
                shape.kv_heads, q_rows + 2 * shape.head_dim, *([shape.hidden] if kind == "weight" else []))
            q, k, v = grouped.split([q_rows, shape.head_dim, shape.head_dim], dim=1)
            width = [shape.hidden] if kind == "weight" else []
            out[f"{attention}q_proj.{kind}"] = q.reshape(shape.heads * shape.head_dim, *width)
            out[f"{attention}k_proj.{kind}"] = k.reshape(shape.kv_heads * shape.head_dim, *width)
            out[f"{attention}v_proj.{kind}"] = v.reshape(shape.kv_heads * shape.head_dim, *width)
        if shape.qk_norm:
            out[attention + "q_norm.weight"] = first[m + "self_attention.q_layernorm.weight"]
            out[attention + "k_norm.weight"] = first[m + "self_attention.k_layernorm.weight"]
        out[attention + "o_proj.weight"] = columns(m + "self_attention.linear_proj.weight")
        out[h + "input_layernorm.weight"] = first[m + "input_layernorm.weight"]
        out[h + "post_attention_layernorm.weight"] = first[m + "pre_mlp_layernorm.weight"]
        mlps = [(h + "mlp.", m + "mlp.")]
        if shape.experts:
            out[h + "mlp.gate.weight"] = first[m + "mlp.router.weight"]
            mlps = [(f"{h}mlp.experts.{e}.", f"{m}mlp.experts.local_experts.{e}.") for e in range(shape.experts)]
        for hf_mlp, mlp in mlps:
            halves = [s[mlp + "linear_fc1.weight"].chunk(2, 0) for s in shards]
            out[hf_mlp + "gate_proj.weight"] = torch.cat([gate for gate, _ in halves])
            out[hf_mlp + "up_proj.weight"] = torch.cat([up for _, up in halves])
            out[hf_mlp + "down_proj.weight"] = columns(mlp + "linear_fc2.weight")
    return out


def _layer_index(name: str) -> int | None:
    parts = name.split(".")
    return int(parts[2]) if name.startswith("decoder.layers.") else None


def _renumbered(name: str, shift: int) -> str:
    parts = name.split(".")
    parts[2] = str(int(parts[2]) + shift)
    return ".".join(parts)


def stage_of(state: dict[str, torch.Tensor], shape: DecoderShape, pp: int, stage: int) -> dict[str, torch.Tensor]:
    """One pipeline stage's part of a whole-model GPTModel state dict: its layers numbered from 0, the
    embedding on the first stage, the final norm and the output layer on the last. With tied weights the
    last stage holds its own copy of the embedding as the output layer (megatron keeps the two equal by
    summing their gradients)."""
    per_stage = shape.layers // pp
    first, last = stage == 0, stage == pp - 1
    out = {}
    for name, tensor in state.items():
        layer = _layer_index(name)
        if layer is not None:
            if stage * per_stage <= layer < (stage + 1) * per_stage:
                out[_renumbered(name, -stage * per_stage)] = tensor
        elif name.startswith("embedding.") and first or not name.startswith("embedding.") and last:
            out[name] = tensor
    if last and shape.tied and pp > 1:
        out["output_layer.weight"] = state["embedding.word_embeddings.weight"]
    return out


def whole_model(stages: list[dict[str, torch.Tensor]], shape: DecoderShape) -> dict[str, torch.Tensor]:
    """The inverse of stage_of: every stage's state dict (in stage order) as one whole-model state dict."""
    per_stage = shape.layers // len(stages)
    out = {}
    for stage, state in enumerate(stages):
        for name, tensor in state.items():
            if _layer_index(name) is not None:
                out[_renumbered(name, stage * per_stage)] = tensor
            elif not (shape.tied and name == "output_layer.weight"):
                out[name] = tensor
    return out


_LOCAL_EXPERTS = ".mlp.experts.local_experts."


def _expert_index(name: str) -> tuple[str, int, str] | None:
    head, found, tail = name.partition(_LOCAL_EXPERTS)
    if not found:
        return None
    index, _, rest = tail.partition(".")
    return head, int(index), rest


def expert_share(state: dict[str, torch.Tensor], shape: DecoderShape, ep: int, ep_rank: int) -> dict[str, torch.Tensor]:
    """One expert-parallel rank's part of a GPTModel state dict holding every expert: its experts (the
    consecutive block ep_rank of experts / ep, numbered from 0 as megatron's local experts) and every
    other weight (the attention, the router, the norms: the same on all expert-parallel ranks)."""
    per_rank = shape.experts // ep
    out = {}
    for name, tensor in state.items():
        expert = _expert_index(name)
        if expert is None:
            out[name] = tensor
        elif ep_rank * per_rank <= expert[1] < (ep_rank + 1) * per_rank:
            out[f"{expert[0]}{_LOCAL_EXPERTS}{expert[1] - ep_rank * per_rank}.{expert[2]}"] = tensor
    return out


def all_experts(shares: list[dict[str, torch.Tensor]], shape: DecoderShape) -> dict[str, torch.Tensor]:
    """The inverse of expert_share: every expert-parallel rank's state dict (in rank order) as one."""
    per_rank = shape.experts // len(shares)
    out = {name: tensor for name, tensor in shares[0].items() if _expert_index(name) is None}
    for rank, share in enumerate(shares):
        for name, tensor in share.items():
            expert = _expert_index(name)
            if expert is not None:
                out[f"{expert[0]}{_LOCAL_EXPERTS}{expert[1] + rank * per_rank}.{expert[2]}"] = tensor
    return out
