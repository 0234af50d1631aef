"""Llama / Qwen2 / Qwen3 decoders in Flax NNX, with the HF model's module tree: a weight's path in the
NNX state, joined with dots, is its name in the HF safetensors file, so loading, export and refit are
renames of nothing. Linear weights keep HF's [out, in] layout (y = x W^T).

Computation follows transformers' modelling code in float32 (RMSNorm and softmax in float32 also
when the weights are cast to bf16), which is what the logprob parity with the torch backends rests on."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from dockyard.policy.decoder_shape import DecoderShape


def _param(shape: tuple[int, ...]) -> nnx.Param:
    # filled from the HF folder right after; zeros keep construction cheap and deterministic
    return nnx.Param(jnp.zeros(shape, jnp.float32))


class Linear(nnx.Module):
    def __init__(self, out_features: int, in_features: int, bias: bool = False):
        self.weight = _param((out_features, in_features))
        self.bias = _param((out_features,)) if bias else None

    def __call__(self, x: jax.Array) -> jax.Array:
        y = x @ self.weight[...].astype(x.dtype).T
        return y + self.bias[...].astype(x.dtype) if self.bias is not None else y


class RMSNorm(nnx.Module):
    def __init__(self, size: int, eps: float):
        self.weight = _param((size,))
        self.eps = eps

    def __call__(self, x: jax.Array) -> jax.Array:
        dtype = x.dtype
        x32 = x.astype(jnp.float32)
        x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        return self.weight[...].astype(dtype) * x32.astype(dtype)


class Embedding(nnx.Module):
    def __init__(self, vocab: int, hidden: int):
        self.weight = _param((vocab, hidden))

    def __call__(self, ids: jax.Array, dtype) -> jax.Array:
        return jnp.take(self.weight[...].astype(dtype), ids, axis=0)


def _rotate_half(x: jax.Array) -> jax.Array:
    half = x.shape[-1] // 2
    return jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def rope(positions: jax.Array, head_dim: int, theta: float, dtype) -> tuple[jax.Array, jax.Array]:
    """cos, sin [B, T, head_dim] for the positions, as transformers' default rotary embedding."""
    inv_freq = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
    freqs = positions.astype(jnp.float32)[..., None] * inv_freq
    angles = jnp.concatenate([freqs, freqs], axis=-1)
    return jnp.cos(angles).astype(dtype), jnp.sin(angles).astype(dtype)


class Attention(nnx.Module):
    def __init__(self, shape: DecoderShape):
        self.heads, self.kv_heads, self.head_dim = shape.heads, shape.kv_heads, shape.head_dim
        self.q_proj = Linear(shape.heads * shape.head_dim, shape.hidden, shape.qkv_bias)
        self.k_proj = Linear(shape.kv_heads * shape.head_dim, shape.hidden, shape.qkv_bias)
        self.v_proj = Linear(shape.kv_heads * shape.head_dim, shape.hidden, shape.qkv_bias)
        self.o_proj = Linear(shape.hidden, shape.heads * shape.head_dim)
        self.q_norm = RMSNorm(shape.head_dim, shape.norm_eps) if shape.qk_norm else None
        self.k_norm = RMSNorm(shape.head_dim, shape.norm_eps) if shape.qk_norm else None

    def __call__(self, x: jax.Array, cos: jax.Array, sin: jax.Array, allowed: jax.Array) -> jax.Array:
        batch, width, _ = x.shape
        q = self.q_proj(x).reshape(batch, width, self.heads, self.head_dim)
        k = self.k_proj(x).reshape(batch, width, self.kv_heads, self.head_dim)
        v = self.v_proj(x).reshape(batch, width, self.kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        c, s = cos[:, :, None, :], sin[:, :, None, :]
        q, k = q * c + _rotate_half(q) * s, k * c + _rotate_half(k) * s
        group = self.heads // self.kv_heads
        k, v = jnp.repeat(k, group, axis=2), jnp.repeat(v, group, axis=2)
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k).astype(jnp.float32) / jnp.sqrt(jnp.float32(self.head_dim))
        scores = jnp.where(allowed[:, None], scores, jnp.finfo(jnp.float32).min)
        weights = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
        out = jnp.einsum("bhqk,bkhd->bqhd", weights, v).reshape(batch, width, self.heads * self.head_dim)
        return self.o_proj(out)


class MLP(nnx.Module):
    def __init__(self, shape: DecoderShape):
        self.gate_proj = Linear(shape.ffn, shape.hidden)
        self.up_proj = Linear(shape.ffn, shape.hidden)
        self.down_proj = Linear(shape.hidden, shape.ffn)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.down_proj(jax.nn.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nnx.Module):
    def __init__(self, shape: DecoderShape):
        self.input_layernorm = RMSNorm(shape.hidden, shape.norm_eps)
        self.self_attn = Attention(shape)
        self.post_attention_layernorm = RMSNorm(shape.hidden, shape.norm_eps)
        self.mlp = MLP(shape)

    def __call__(self, x, cos, sin, allowed):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, allowed)
        return x + self.mlp(self.post_attention_layernorm(x))


class DecoderBody(nnx.Module):
    """HF's `model.`: the embedding, the layers and the final norm."""

    def __init__(self, shape: DecoderShape):
        self.embed_tokens = Embedding(shape.vocab, shape.hidden)
        self.layers = nnx.List([DecoderLayer(shape) for _ in range(shape.layers)])
        self.norm = RMSNorm(shape.hidden, shape.norm_eps)


class CausalLM(nnx.Module):
    """The decoder with its LM head (absent when tied: the embedding's matrix is used)."""

    def __init__(self, shape: DecoderShape, remat: bool = False):
        self.shape, self.remat = shape, remat
        self.model = DecoderBody(shape)
        self.lm_head = None if shape.tied else Linear(shape.vocab, shape.hidden)

    def hidden_states(self, ids: jax.Array, positions: jax.Array, allowed: jax.Array, dtype) -> jax.Array:
        """[B, T, hidden] after the final norm; `allowed` [B, T, T]: which keys each query sees."""
        x = self.model.embed_tokens(ids, dtype)
        cos, sin = rope(positions, self.shape.head_dim, self.shape.rope_theta, dtype)
        for layer in self.model.layers:
            if self.remat:
                x = nnx.remat(lambda module, h: module(h, cos, sin, allowed))(layer, x)
            else:
                x = layer(x, cos, sin, allowed)
        return self.model.norm(x)

    def logits(self, hidden: jax.Array) -> jax.Array:
        """float32 logits of the given hidden states [..., hidden]."""
        head = self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        return (hidden @ head[...].astype(hidden.dtype).T).astype(jnp.float32)
