"""What of an HF decoder's config (Llama, Qwen2, Qwen3, Qwen3-MoE) decides a backend's own model: the
megatron and JAX backends build their models from it instead of from transformers' classes."""

from __future__ import annotations

from dataclasses import dataclass

from dockyard.policy.samples import PolicySetupError

FAMILIES = ("llama", "qwen2", "qwen3", "qwen3_moe")
# the families whose MLP is a mixture of experts, and the backends that build one
MIXTURES = ("qwen3_moe",)
_BUILDS_EXPERTS = ("megatron",)


@dataclass(frozen=True)
class DecoderShape:
    """What of an HF config decides a backend model's structure and its weights' layout."""

    family: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    norm_eps: float
    rope_theta: float
    max_positions: int
    tied: bool
    qkv_bias: bool
    qk_norm: bool
    # a mixture of experts in every layer's MLP (0 experts: a dense MLP of width ffn)
    experts: int = 0
    experts_per_token: int = 0
    expert_ffn: int = 0
    # the chosen experts' router probabilities renormalised to sum to 1 (Qwen3-MoE's norm_topk_prob)
    renormalise_topk: bool = False

    @classmethod
    def of(cls, config: dict, name: str, backend: str = "megatron") -> "DecoderShape":
        family = config.get("model_type")
        known = [f for f in FAMILIES if f not in MIXTURES or backend in _BUILDS_EXPERTS]
        if family not in known:
            raise PolicySetupError(f"policy.backend {backend}: {name} is a {family!r} model; the {backend} weight "
                                   f"converter knows the {', '.join(known)} families")
        rope = config.get("rope_parameters") or {}
        scaling = rope.get("rope_type", "default") if rope else (config.get("rope_scaling") or {}).get("rope_type",
                                                                                                     "default")
        if scaling not in ("default", None):
            raise PolicySetupError(f"policy.backend {backend}: {name} uses {scaling!r} RoPE scaling, which the {backend} "
                                   "backend does not build yet; use the dtensor backend")
        heads = config["num_attention_heads"]
        experts = {}
        if family in MIXTURES:
            dense, step = config.get("mlp_only_layers") or [], config.get("decoder_sparse_step", 1)
            if dense or step != 1:
                raise PolicySetupError(f"policy.backend {backend}: {name} mixes dense layers {dense} "
                                       f"(decoder_sparse_step {step}) among its expert layers; the {backend} backend "
                                       "builds models with experts in every layer")
            experts = {"experts": config.get("num_experts") or config["num_local_experts"],
                       "experts_per_token": config["num_experts_per_tok"],
                       "expert_ffn": config["moe_intermediate_size"],
                       "renormalise_topk": bool(config.get("norm_topk_prob", False))}
        return cls(family=family, layers=config["num_hidden_layers"], hidden=config["hidden_size"], heads=heads,
                   kv_heads=config.get("num_key_value_heads") or heads,
                   head_dim=config.get("head_dim") or config["hidden_size"] // heads,
                   ffn=config["intermediate_size"], vocab=config["vocab_size"], norm_eps=config["rms_norm_eps"],
                   rope_theta=rope.get("rope_theta", config.get("rope_theta", 10000.0)),
                   max_positions=config.get("max_position_embeddings", 4096),
                   tied=bool(config.get("tie_word_embeddings", False)),
                   qkv_bias=family == "qwen2" or bool(config.get("attention_bias", False)),
                   qk_norm=family in ("qwen3", "qwen3_moe"), **experts)

    def check_stages(self, pp: int, name: str, chunks: int = 1) -> None:
        """The layers split evenly over `pp` pipeline stages of `chunks` model chunks each (megatron's
        default layer placement)."""
        if self.layers % (pp * chunks) == 0:
            return
        if chunks == 1:
            raise PolicySetupError(f"policy.megatron_cfg.pipeline_model_parallel_size {pp}: {name} has {self.layers} "
                                   f"layers, which {pp} pipeline stages cannot split evenly")
        raise PolicySetupError(f"policy.megatron_cfg.virtual_pipeline_model_parallel_size {chunks}: {name} has "
                               f"{self.layers} layers, which {pp} pipeline stages x {chunks} model chunks cannot "
                               "split evenly")

    def check_split(self, tp: int, name: str, setting: str = "policy.megatron_cfg.tensor_model_parallel_size",
                    devices: str = "ranks") -> None:
        """Heads, MLP width and vocabulary split evenly over `tp` tensor-parallel `devices` (`setting`)."""
        widths = (("expert MLP width", self.expert_ffn),) if self.experts else (("MLP width", self.ffn),)
        for what, count in (("key/value heads", self.kv_heads), ("attention heads", self.heads), *widths,
                            ("vocabulary", self.vocab)):
            if count % tp:
                raise PolicySetupError(f"{setting} {tp}: {name} has {count} {what}, which {tp} {devices} cannot "
                                       "split evenly")

    def check_experts(self, ep: int, name: str) -> None:
        """The experts split evenly over `ep` expert-parallel ranks; expert parallelism needs experts."""
        if ep == 1:
            return
        if not self.experts:
            raise PolicySetupError(f"policy.megatron_cfg.expert_model_parallel_size {ep}: {name} is a dense "
                                   f"{self.family} model without experts to split")
        if self.experts % ep:
            raise PolicySetupError(f"policy.megatron_cfg.expert_model_parallel_size {ep}: {name} has {self.experts} "
                                   f"experts per layer, which {ep} ranks cannot split evenly")
