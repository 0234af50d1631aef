"""`policy`: the trained model, its trainer backend, optimizer and generation engine."""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import PositiveInt

from dockyard.config.fields import OpenSection, Section, component, field

Precision = Literal["fp32", "bf16", "fp16"]


class DynamicBatching(Section):
    enabled: bool = field(False, "Pack micro-batches by token count instead of a fixed sample count.",
                          "When true, policy.train_micro_batch_size is ignored for training.")
    max_tokens_per_gpu: PositiveInt = field(16384, "Per-rank token budget of one packed micro-batch.",
                                            "Must be >= policy.max_total_sequence_length.")
    share_prompts: bool = field(
        False, "Train each prompt once per group: a row holds the prompt and all its sampled responses, "
        "each response attending to the prompt and itself (block mask, per-response positions).",
        "Needs enabled: true and the megatron backend or the dtensor backend with sdpa or eager attention. "
        "Same logprobs as separate rows; worth it when prompts are long next to responses.")


class DTensorConfig(Section):
    tensor_parallel_size: PositiveInt = field(1, "Tensor-parallel degree (TP): each decoder layer split over TP "
                                              "neighbouring ranks by the architecture's transformers TP plan, the "
                                              "embedding and LM head over the vocabulary; FSDP shards over the rest "
                                              "(docs/parallelism.md).",
                                              "Trainer ranks must be divisible by TP x CP; the model's heads and "
                                              "MLP width by TP.")
    context_parallel_size: PositiveInt = field(1, "Context-parallel degree (CP): the ranks of a CP group train "
                                               "the same sequences, each running the model on its share of the "
                                               "positions; attention gathers K/V over the group "
                                               "(docs/parallelism.md).",
                                               "Trainer ranks must be divisible by TP x CP; not with TP > 1 or "
                                               "shared-prompt rows; needs SDPA attention.")
    cpu_offload: bool = field(False, "Offload sharded parameters, gradients and optimizer state to CPU memory "
                              "(FSDP2 CPUOffloadPolicy; the optimizer steps on the CPU).", "GPU runs only.")
    activation_checkpointing: bool = field(False, "Recompute activations in backward to save memory.")


class JaxMesh(Section):
    data: PositiveInt = field(1, "Devices the batch is split over (the mesh's `data` axis).",
                              "data x model devices must exist: GPUs, or host devices on CPU.")
    model: PositiveInt = field(1, "Devices each weight matrix is split over (the `model` axis): attention "
                               "heads and MLP width as Megatron's column / row split, the vocabulary for the "
                               "embedding and LM head.", "Must divide the model's heads, MLP width and vocabulary.")


class JaxConfig(Section):
    mesh: JaxMesh = field(JaxMesh, "The trainer's device mesh (jax.sharding), data x model devices.",
                          "On CPU, data x model host devices are made (--xla_force_host_platform_device_count).")
    remat: bool = field(False, "Recompute each decoder layer's activations in the backward pass (jax.checkpoint) "
                        "to save memory.")
    compilation_cache_dir: Optional[str] = field(
        "auto", "Persistent XLA compilation cache: a requeued or repeated run reuses the compiled steps; "
        "auto puts it under checkpointing.checkpoint_dir/jax_compilation_cache; null turns it off.")


class MegatronConfig(OpenSection):
    """Forwarded to megatron-core's TransformerConfig / DDP / optimizer configs; any upstream field
    can be added by name."""

    tensor_model_parallel_size: PositiveInt = field(1, "Tensor-parallel size (TP).",
                                                    "Trainer ranks must be divisible by TP x PP x CP.")
    pipeline_model_parallel_size: PositiveInt = field(1, "Pipeline-parallel size (PP).")
    virtual_pipeline_model_parallel_size: Optional[PositiveInt] = field(
        None, "Virtual pipeline stages per rank (shrinks PP bubbles).", "Requires PP > 1.")
    context_parallel_size: PositiveInt = field(1, "Context-parallel size (CP).")
    expert_model_parallel_size: PositiveInt = field(1, "Expert-parallel size (EP) for MoE; 1 for dense models.",
                                                    "Trainer ranks must be divisible by ETP x EP x PP.")
    expert_tensor_parallel_size: Optional[PositiveInt] = field(
        None, "TP size of the MoE experts (ETP); null means the same as TP.")
    bf16: bool = field(False, "Train in bf16.", "Mutually exclusive with fp16; must agree with policy.precision.")
    fp16: bool = field(False, "Train in fp16.", "Mutually exclusive with bf16; must agree with policy.precision.")
    fp8: Optional[str] = field(None, "FP8 recipe name (hybrid, e4m3); null disables FP8.",
                               "Needs bf16 or fp16 as the primary precision.")
    fp8_param: bool = field(False, "Also store parameters in FP8.", "Only with fp8 set.")
    grad_reduce_in_fp32: bool = field(True, "Reduce gradients in fp32 (numerically stable; keep on).")
    use_distributed_optimizer: bool = field(True, "Shard optimizer state over data-parallel ranks (ZeRO-1).")
    optimizer_cpu_offload: bool = field(False, "Offload optimizer state to CPU.")


class OptimizerConfig(Section):
    name: Literal["adamw", "sgd"] = field("adamw", "Optimizer: AdamW, or plain SGD (lr, weight_decay).",
                                          "betas / eps only with adamw.")
    lr: float = field(1.0e-6, "Peak learning rate.", gt=0)
    weight_decay: float = field(0.01, "Decoupled weight decay.", ge=0)
    betas: tuple[float, float] = field((0.9, 0.999), "Adam betas.")
    eps: float = field(1.0e-8, "Adam epsilon.", gt=0)


class SchedulerConfig(Section):
    name: Literal["constant", "linear", "cosine"] = field("constant", "LR shape after warmup.")
    warmup_steps: int = field(0, "Linear warmup steps from 0 to the peak LR.", ge=0)
    min_lr_ratio: float = field(0.0, "Final LR as a fraction of the peak (linear / cosine).", ge=0, le=1)


class LoraConfig(Section):
    enabled: bool = field(False, "Train low-rank adapters instead of the full weights.")
    rank: PositiveInt = field(8, "Adapter rank.")
    alpha: float = field(16.0, "Adapter scaling numerator (scale = alpha / rank).", gt=0)
    dropout: float = field(0.0, "Dropout on the adapter input.", ge=0, lt=1)
    target_modules: list[str] = field(["q_proj", "k_proj", "v_proj", "o_proj"], "Module names to adapt.")


class VllmConfig(OpenSection):
    """Forwarded to vLLM's engine arguments; any upstream field can be added by name."""

    precision: Literal["bf16", "fp16", "fp32", "fp8"] = field(
        "bf16", "Serving precision; fp8 quantises weights on every refit while training stays in bf16.",
        "fp8 needs GPUs (cluster.gpus_per_node > 0).")
    tensor_parallel_size: PositiveInt = field(1, "Tensor-parallel size of one vLLM replica "
                                              "(the family sets it to cluster.rollout_gpus_per_replica).")
    pipeline_parallel_size: PositiveInt = field(1, "Pipeline-parallel size of one vLLM replica.")
    gpu_memory_utilization: float = field(0.8, "Fraction of GPU memory vLLM may use.", gt=0, le=1)
    max_model_len: Optional[PositiveInt] = field(None, "Engine context length; null uses "
                                                 "policy.max_total_sequence_length.")
    enforce_eager: bool = field(False, "Disable CUDA graphs (slower, simpler weight updates).")
    env_vars: dict[str, str] = field({}, "Environment variables passed to the vLLM workers "
                                     "(e.g. a fused-MoE backend for one model).")


class SglangConfig(OpenSection):
    """Forwarded to SGLang's ServerArgs; any upstream field can be added by name."""

    tensor_parallel_size: PositiveInt = field(1, "Tensor-parallel size of one SGLang replica.")
    mem_fraction_static: float = field(0.8, "Fraction of GPU memory reserved for the KV cache.", gt=0, le=1)
    disable_cuda_graph: bool = field(True, "Disable CUDA graphs (helps hot weight updates).")
    load_format: Literal["auto", "dummy"] = field("auto", "dummy builds an empty model and relies on the "
                                                  "first refit for weights.")
    env_vars: dict[str, str] = field({}, "Environment variables passed to the SGLang servers.")


class EmbeddedConfig(Section):
    max_batch_size: PositiveInt = field(64, "Sequences decoded together in one batch.")
    device: Literal["auto", "cpu", "cuda"] = field("auto", "Where the embedded engine runs.")


class ChatTemplateConfig(Section):
    path: Optional[str] = field(None, "Jinja2 chat template file; null uses the tokenizer's own. "
                                "Relative paths resolve against the config file's folder (one given as a command-line "
                                "override, against the working folder).")
    generation_prompt_kwargs: dict[str, object] = field(
        {}, "Keyword arguments for apply_chat_template (e.g. enable_thinking: true).")


class RouterConfig(Section):
    """The agent-side router that forwards multi-turn requests to the generation servers (not built:
    the agent loop sends each turn to the servers itself; a setting away from its default is refused)."""

    port: int = field(0, "Listen port; 0 picks a free one.", ge=0, le=65535)
    accumulate_reasoning: bool = field(True, "Keep reasoning tokens in the context across turns.")
    worker_load_threshold: PositiveInt = field(32, "In-flight requests per server before load balancing.")
    proxy_timeout_s: float = field(1800.0, "Router -> server per-request timeout.",
                                   "Must be >= the longest single generation.", gt=0)
    abort_timeout_s: float = field(600.0, "Wait for in-flight requests to abort at a step boundary.", gt=0)
    max_connections: PositiveInt = field(512, "Concurrent connections the router accepts.")


class GenerationConfig(Section):
    backend: component("generation_backend") = field("embedded", "Generation engine (see `dockyard list`).")
    temperature: float = field(1.0, "Sampling temperature.", "Finite and >= 0; NaN/Inf is rejected.",
                               ge=0, allow_inf_nan=False)
    top_p: float = field(1.0, "Nucleus sampling mass.", "Finite, in (0, 1].", gt=0, le=1, allow_inf_nan=False)
    top_k: Optional[PositiveInt] = field(None, "Top-k sampling; null disables it.")
    max_new_tokens: Optional[PositiveInt] = field(
        None, "Response tokens per generation call; null uses the room left in "
        "policy.max_total_sequence_length.", "Must be < policy.max_total_sequence_length.")
    stop_strings: list[str] = field([], "Strings that end a generation.")
    stop_token_ids: list[int] = field([], "Token ids that end a generation (besides EOS).")
    ignore_eos: bool = field(False, "Keep generating past the end-of-sequence token "
                             "(for rewards that need a fixed-length completion).")
    weight_transfer: Literal["auto", "broadcast", "shared_memory"] = field(
        "auto", "How a refit reaches each generation replica: shared_memory writes one safetensors file to "
        "/dev/shm that the replicas on trainer rank 0's machine load; broadcast sends the tensors once over a "
        "torch.distributed group holding every other replica; auto picks per replica, shared_memory when its "
        "address is on rank 0's machine (docs/generation.md).", "shared_memory needs the replicas on that machine.")
    eval_temperature: Optional[float] = field(None, "Temperature for validation rollouts; null reuses "
                                              "temperature.", ge=0, allow_inf_nan=False)
    allow_multimodal_inputs: bool = field(False, "Forward per-sample images to the engine (VLM/CUA recipes).",
                                          "sglang refuses image inputs with an error (not yet forwarded).")
    max_image_pixels: PositiveInt = field(178_956_970, "Largest decoded image accepted (decompression-bomb guard).")
    max_images_per_sample: PositiveInt = field(8, "Most images one sample may carry.")
    chat_template: ChatTemplateConfig = field(ChatTemplateConfig, "Chat template used to build prompts.")
    router: RouterConfig = field(RouterConfig, "Multi-turn request router.")
    vllm_cfg: VllmConfig = field(VllmConfig, "vLLM engine settings (backend: vllm).")
    sglang_cfg: SglangConfig = field(SglangConfig, "SGLang server settings (backend: sglang).")
    embedded_cfg: EmbeddedConfig = field(EmbeddedConfig, "Embedded engine settings (backend: embedded).")


class PolicyConfig(Section):
    model_name: str = field(..., "Local folder (or cluster path) of the HF model to train; also the "
                            "tokenizer unless tokenizer_name is set. No hub downloads at run time.")
    tokenizer_name: Optional[str] = field(None, "Tokenizer folder; null uses model_name.")
    backend: component("policy_backend") = field("dtensor", "Trainer backend (see `dockyard list`).")
    precision: Precision = field("bf16", "Training / master-weight precision.",
                                 "Must agree with megatron_cfg.bf16 / fp16 when megatron is used.")
    max_total_sequence_length: PositiveInt = field(..., "Prompt + response token budget per sample.")
    train_global_batch_size: PositiveInt = field(
        ..., "Trajectories per optimizer step (M).",
        "grpo.num_prompts_per_step x grpo.num_generations_per_prompt must be divisible by it; "
        "it must be divisible by dp_size x train_micro_batch_size.")
    train_micro_batch_size: PositiveInt = field(1, "Samples per forward/backward per rank.")
    logprob_batch_size: Optional[PositiveInt] = field(None, "Samples per logprob forward; null uses "
                                                      "train_micro_batch_size.")
    max_grad_norm: float = field(1.0, "Global gradient-norm clip; 0 disables clipping.", ge=0)
    seed: int = field(42, "Seed for initialisation, data order and sampling.")
    dynamic_batching: DynamicBatching = field(DynamicBatching, "Token-budget micro-batching.")
    dtensor_cfg: DTensorConfig = field(DTensorConfig, "Parallelism of the dtensor (FSDP2) backend.")
    megatron_cfg: Optional[MegatronConfig] = field(None, "megatron-core settings (backend: megatron).",
                                                   "Required when backend is megatron.")
    jax_cfg: JaxConfig = field(JaxConfig, "JAX (Flax NNX) backend settings (backend: jax).",
                               "Read only when backend is jax; set away from its defaults otherwise, it is "
                               "refused.")
    optimizer: OptimizerConfig = field(OptimizerConfig, "Optimizer.")
    scheduler: SchedulerConfig = field(SchedulerConfig, "Learning-rate schedule.")
    lora: LoraConfig = field(LoraConfig, "Low-rank adaptation.")
    generation: GenerationConfig = field(GenerationConfig, "Rollout engine and sampling.")
    env_vars: dict[str, str] = field({}, "Environment variables for the trainer ranks.")
