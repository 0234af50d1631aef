"""`dtensor` policy backend: a transformers causal LM sharded with FSDP2 (`fully_shard`) over the
trainer world (gloo on CPU, NCCL on GPU), optionally split with tensor parallelism inside groups of
neighbouring ranks (a data-parallel x TP mesh, tensor_parallel.py) or with context parallelism, each
rank of a group running its slice of the sequence positions (context_parallel.py). It computes
logprobs, takes optimizer steps and exports full weights for the generation servers."""

from __future__ import annotations

import sys
from typing import Callable
import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard
from transformers.core_model_loading import revert_weight_conversion

from dockyard.config.schema import MasterConfig
from dockyard.config.topology import mesh_line
from dockyard.distributed import WorldInfo
from dockyard.models import DTYPES, load_causal_lm
from dockyard.policy.context_parallel import ContextParallelError, SequenceShards, use_context_parallel_attention
from dockyard.policy.prompt_rows import layout_rows, plan_batches
from dockyard.policy.samples import (PolicySetupError, Sample, TrainingInterrupted, lr_factor,
                                     plan_shared_prompt_rows, same_count_on_every_rank)
from dockyard.io.checkpoint import TorchModuleState, load_model_weights
from dockyard.policy.base import Policy
from dockyard.policy.training import micro_batch_loss
from dockyard.vision import VisionInputError, VisionInputs, is_vision_model
from dockyard.policy.lora import BaseModelReference, LoraSetupError, add_adapters, merged_weights
from dockyard.policy.tensor_parallel import (TensorParallelError, VocabShard, apply_tensor_parallel, clip_gradients,
                                             quiet_tensor_parallel_warnings, sum_partial_gradients, token_logprobs,
                                             vocab_shard)


def _left_padded(rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(ids, attention mask, positions) of rows padded on the left, so that every row ends together."""
    width = max(len(row) for row in rows)
    ids = torch.zeros((len(rows), width), dtype=torch.long)
    attention = torch.zeros((len(rows), width), dtype=torch.long)
    for index, row in enumerate(rows):
        ids[index, width - len(row):] = torch.tensor(row)
        attention[index, width - len(row):] = 1
    return ids, attention, (attention.cumsum(-1) - 1).clamp(min=0)


def _decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    inner = getattr(model, "model", model)
    # a vision-language model's decoder (Idefics3: text_model, Qwen2-VL: language_model)
    inner = getattr(inner, "text_model", None) or getattr(inner, "language_model", None) or inner
    layers = getattr(inner, "layers", None)
    if layers is None:
        raise ValueError(f"{type(model).__name__}: cannot find its decoder layers (model.model.layers) to shard")
    return list(layers)


def build_optimizer(opt, parameters, foreach: bool | None = None) -> torch.optim.Optimizer:
    if opt.name == "sgd":   # plain SGD; weight decay as L2 in the gradient (torch's SGD)
        return torch.optim.SGD(parameters, lr=opt.lr, weight_decay=opt.weight_decay, foreach=foreach)
    return torch.optim.AdamW(parameters, lr=opt.lr, betas=tuple(opt.betas), eps=opt.eps,
                             weight_decay=opt.weight_decay, foreach=foreach)


class DTensorPolicy(Policy):
    """HF transformers model sharded with FSDP2 (fully_shard) over torch.distributed."""

    def __init__(self, config: MasterConfig, world: WorldInfo, device: torch.device, total_optimizer_steps: int,
                 model_path: str | None = None, trainable: bool = True):
        self.config, self.world, self.device = config, world, device
        policy = config.policy
        self.temperature = policy.generation.temperature or 1.0
        self.model = load_causal_lm(model_path or policy.model_name, dtype=torch.float32).to(device)
        _without_dropout(self.model)
        if policy.lora.enabled and trainable:
            try:
                add_adapters(self.model, policy.lora, model_path or policy.model_name)
            except LoraSetupError as err:
                raise PolicySetupError(str(err)) from None
        if policy.dtensor_cfg.activation_checkpointing and trainable:
            self.model.gradient_checkpointing_enable()
        # names of the state dict that alias another entry (lm_head.weight of a tied embedding)
        self.alias_names = set(self.model.state_dict()) - {n for n, _ in self.model.named_parameters()} \
            - {n for n, _ in self.model.named_buffers()}
        self.share_prompts = policy.dynamic_batching.enabled and policy.dynamic_batching.share_prompts
        attention = getattr(self.model.config, "_attn_implementation", None)
        if self.share_prompts and attention not in ("sdpa", "eager"):
            raise PolicySetupError(f"policy.dynamic_batching.share_prompts needs sdpa or eager attention "
                                   f"(a 4-D mask); {model_path or policy.model_name} loads with {attention}")
        tp, cp = policy.dtensor_cfg.tensor_parallel_size, policy.dtensor_cfg.context_parallel_size
        self.vision = None      # a vision-language model's processor: samples may carry images
        if is_vision_model(model_path or policy.model_name):
            if tp > 1 or cp > 1 or self.share_prompts:
                raise PolicySetupError(f"{model_path or policy.model_name} is a vision-language model: "
                                       "policy.dtensor_cfg.tensor_parallel_size / context_parallel_size > 1 and "
                                       "policy.dynamic_batching.share_prompts are not built for image inputs")
            try:
                self.vision = VisionInputs(model_path or policy.model_name)
            except VisionInputError as err:
                raise PolicySetupError(str(err)) from None
        if world.model_parallel_size != tp * cp or world.world_size % (tp * cp):
            raise PolicySetupError(f"policy.dtensor_cfg: tensor_parallel_size {tp} x context_parallel_size {cp}, but "
                                   f"the trainer world has {world.world_size} ranks in model-parallel groups of "
                                   f"{world.model_parallel_size}")
        self.vocab: VocabShard | None = None     # this rank's slice of the vocabulary under TP
        partial_grad: set[str] = set()
        self.tp_group = self.cp_group = None
        if cp > 1:
            if tp > 1 or self.share_prompts:
                raise PolicySetupError("policy.dtensor_cfg.context_parallel_size: not built together with "
                                       "tensor_parallel_size > 1 or dynamic_batching.share_prompts")
            grid = init_device_mesh(device.type, (world.data_size, cp), mesh_dim_names=("dp", "cp"))
            self.cp_group = grid["cp"].get_group()
            try:
                use_context_parallel_attention(self.model, self.cp_group, model_path or policy.model_name)
            except ContextParallelError as err:
                raise PolicySetupError(str(err)) from None
            # the ranks of a CP group hold the same weights: FSDP shards them over the whole world
            mesh = init_device_mesh(device.type, (world.world_size,))
        elif tp > 1:
            grid = init_device_mesh(device.type, (world.data_size, tp), mesh_dim_names=("dp", "tp"))
            try:
                partial_grad = apply_tensor_parallel(self.model, grid["tp"], model_path or policy.model_name)
            except TensorParallelError as err:
                raise PolicySetupError(str(err)) from None
            self.vocab, self.tp_group = vocab_shard(self.model, grid["tp"]), grid["tp"].get_group()
            mesh = grid["dp"]
            quiet_tensor_parallel_warnings()
        else:
            mesh = init_device_mesh(device.type, (world.world_size,))
        if world.is_main and trainable:
            print(f"dockyard: {mesh_line(world.world_size, world.data_size, tp, cp)}", file=sys.stderr, flush=True)
        compute = DTYPES[policy.precision]
        mixed = MixedPrecisionPolicy(param_dtype=compute, reduce_dtype=torch.float32) \
            if compute != torch.float32 else MixedPrecisionPolicy()
        # GPU runs only: a CPU run's state is in host memory already (support.py refuses the setting there)
        offload = CPUOffloadPolicy() if policy.dtensor_cfg.cpu_offload and device.type == "cuda" else OffloadPolicy()
        for layer in _decoder_layers(self.model):
            fully_shard(layer, mesh=mesh, mp_policy=mixed, offload_policy=offload)
        fully_shard(self.model, mesh=mesh, mp_policy=mixed, offload_policy=offload)
        self.fsdp_size = mesh.size()
        self.partial_grad = [p for n, p in self.model.named_parameters() if n in partial_grad]
        if len(self.partial_grad) != len(partial_grad):
            raise PolicySetupError(f"tensor parallel: parameters not found after sharding: {sorted(partial_grad)}")
        self.optimizer = self.scheduler = None
        if trainable:
            # TP-split and plain weights live on different meshes, which foreach kernels cannot mix
            self.optimizer = build_optimizer(policy.optimizer, self.trainable_parameters(),
                                             foreach=False if tp > 1 else None)
            sched = policy.scheduler
            self.scheduler = torch.optim.lr_scheduler.LambdaLR(
                self.optimizer, lambda step: lr_factor(step, sched.warmup_steps, total_optimizer_steps,
                                                       sched.name, sched.min_lr_ratio))
        else:
            self.model.requires_grad_(False)

    # --- batching ---------------------------------------------------------------------------

    def _micro_batches(self, samples: list[Sample], micro_size: int) -> list[list[int]]:
        """Indices per micro-batch; every rank gets the same number (empty ones pad), since each
        forward is a collective under FSDP."""
        batches = plan_batches(samples, micro_size, self.config.policy.dynamic_batching, self.share_prompts)
        return same_count_on_every_rank(batches)

    def _forward_logprobs(self, samples: list[Sample], with_entropy: bool):
        """Logprobs (and entropy) of each sample's response tokens, as [B, R] right-aligned rows.

        Left padding lines up every sequence's end, so only the last R + 1 positions need logits
        (R = longest response): the LM head, a large share of a small model's compute, skips the
        prompts."""
        if any(s.images for s in samples) or (self.vision is not None and torch.is_grad_enabled()):
            return self._forward_with_images(samples, with_entropy)
        if self.share_prompts and len(samples) > 1:
            return self._forward_shared_prompts(samples, with_entropy)
        responses = max(1, max(s.response_length for s in samples))
        ids, attention, positions = _left_padded([s.token_ids for s in samples])
        if self.cp_group is not None:
            return self._forward_context_parallel(ids, attention, positions, responses, with_entropy)
        ids, attention, positions = ids.to(self.device), attention.to(self.device), positions.to(self.device)
        logits = self.model(input_ids=ids, attention_mask=attention, position_ids=positions, use_cache=False,
                            logits_to_keep=responses + 1).logits[:, :-1]
        return token_logprobs(logits, ids[:, -responses:], self.temperature, with_entropy, self.vocab)

    def _forward_with_images(self, samples: list[Sample], with_entropy: bool):
        """_forward_logprobs' rows for samples with images: each placeholder expanded into its image's
        tokens and the pixel values beside them (vision.py), then the logprobs of the original response
        tokens picked out of the expanded rows (a placeholder's own entry is its expansion's last token:
        observations are never trained).

        A training micro-batch without images gets a stand-in row (one small image) whose logprobs join the
        loss times zero: every rank's backward then has gradients for the vision tower, whose reduction
        FSDP runs over all ranks (a rank without them would send fewer bytes and break the collective)."""
        if self.vision is None:
            raise PolicySetupError(f"a sample carries images but {self.config.policy.model_name} is not a "
                                   "vision-language model (its config.json has no vision_config)")
        stand_in = torch.is_grad_enabled() and not any(s.images for s in samples)
        if stand_in:
            ids, image = self.vision.stand_in()
            samples = samples + [Sample(ids, len(ids) - 1, images=[image])]
        expanded = [self.vision.expand(s.token_ids, s.prompt_length, s.images or []) for s in samples]
        responses = max(1, max(len(e.token_ids) - e.prompt_length for e in expanded))
        ids, attention, positions = _left_padded([e.token_ids for e in expanded])
        extra = {name: tensor.to(self.device) for name, tensor in
                 self.vision.model_inputs([e.pixels for e in expanded], ids).items()}
        if not self.vision.mrope:   # a 3-D rotary model builds its positions from the mask and the image tokens
            extra["position_ids"] = positions.to(self.device)
        logits = self.model(input_ids=ids.to(self.device), attention_mask=attention.to(self.device), use_cache=False,
                            logits_to_keep=responses + 1, **extra).logits[:, :-1]
        logprobs, entropy = token_logprobs(logits, ids[:, -responses:].to(self.device), self.temperature,
                                           with_entropy, self.vocab)
        # back to the original tokens, right-aligned as every other path returns them
        kept = max(1, max(s.response_length for s in samples))
        rows = torch.zeros((len(samples), kept), dtype=torch.long)
        cols = torch.zeros((len(samples), kept), dtype=torch.long)
        for row, (sample, grown) in enumerate(zip(samples, expanded)):
            picked = [responses - (len(grown.token_ids) - grown.where[c])
                      for c in range(sample.prompt_length, len(sample.token_ids))]
            rows[row] = row
            cols[row, kept - len(picked):] = torch.tensor(picked, dtype=torch.long)
        rows, cols = rows.to(logprobs.device), cols.to(logprobs.device)
        logprobs, entropy = logprobs[rows, cols], (entropy[rows, cols] if entropy is not None else None)
        if stand_in:
            logprobs = logprobs[:-1] + 0.0 * logprobs[-1:].sum()
            entropy = entropy[:-1] if entropy is not None else None
        return logprobs, entropy

    def _forward_context_parallel(self, ids, attention, positions, responses: int, with_entropy: bool):
        """_forward_logprobs' rows, this rank running the model on its share of the positions only
        (SequenceShards). The LM head runs on the local positions that predict a response token;
        their logprobs are combined over the group, so every CP rank returns the whole [B, R]."""
        shards = SequenceShards(ids.shape[1], self.cp_group)
        ids, attention, positions = shards.pad(ids), shards.pad(attention), shards.pad(positions)
        first = shards.width - responses - 1
        predicting = ((shards.local >= first) & (shards.local < shards.width - 1)).nonzero()[:, 0]
        local_ids = ids[:, shards.local].to(self.device)
        logits = self.model(input_ids=local_ids, attention_mask=shards.attention_mask(attention.bool()).to(self.device),
                            position_ids=positions[:, shards.local].to(self.device), use_cache=False,
                            logits_to_keep=predicting.to(self.device)).logits
        where = shards.local[predicting]
        targets = ids[:, where + 1].to(self.device)
        logprobs, entropy = token_logprobs(logits, targets, self.temperature, with_entropy, None)
        logprobs = shards.combine(logprobs, where)[:, first:-1]
        if entropy is not None:
            entropy = shards.combine(entropy, where)[:, first:-1]
        return logprobs, entropy

    def _forward_shared_prompts(self, samples: list[Sample], with_entropy: bool):
        """As _forward_logprobs, with each prompt computed once per row (prompt_rows.py)."""
        budget = self.config.policy.dynamic_batching.max_tokens_per_gpu
        layout = layout_rows(samples, plan_shared_prompt_rows(samples, budget))
        first = layout.first
        mask = layout.allowed
        if self.model.config._attn_implementation == "eager":
            mask = torch.zeros(mask.shape, dtype=DTYPES[self.config.policy.precision]).masked_fill(
                ~mask, torch.finfo(DTYPES[self.config.policy.precision]).min)
        logits = self.model(input_ids=layout.ids.to(self.device), attention_mask=mask.to(self.device),
                            position_ids=layout.positions.to(self.device), use_cache=False,
                            logits_to_keep=layout.ids.shape[1] - first).logits
        picked = logits[layout.source_row, layout.source_pos - first]
        flat, flat_entropy = token_logprobs(picked, layout.targets.to(picked.device), self.temperature,
                                            with_entropy, self.vocab)
        return layout.scatter(flat), (layout.scatter(flat_entropy) if with_entropy else None)

    def _dummy(self) -> list[Sample]:
        return [Sample(token_ids=[0, 0], prompt_length=1)]

    # --- logprobs -----------------------------------------------------------------------------

    @torch.no_grad()
    def logprobs(self, samples: list[Sample]) -> list[torch.Tensor]:
        """Per sample, the logprobs of its response tokens under the current weights."""
        policy = self.config.policy
        micro = policy.logprob_batch_size or policy.train_micro_batch_size
        out: list[torch.Tensor | None] = [None] * len(samples)
        for batch in self._micro_batches(samples, micro):
            chosen = [samples[i] for i in batch] or self._dummy()
            logprobs, _ = self._forward_logprobs(chosen, with_entropy=False)
            for row, index in enumerate(batch):
                length = samples[index].response_length
                out[index] = logprobs[row, logprobs.shape[1] - length:].cpu()
        return out

    # --- training -----------------------------------------------------------------------------

    def train_mini_batch(self, samples: list[Sample], old_logprobs: list[torch.Tensor] | None,
                         ref_logprobs: list[torch.Tensor] | None, loss_fn,
                         interrupt: Callable[[], bool] | None = None,
                         before_loss: Callable[[list[Sample], list[torch.Tensor]], None] | None = None
                         ) -> dict[str, float]:
        """One optimizer step on this rank's share of a mini-batch. Without `old_logprobs` the
        weights have not moved since sampling, so the forward pass's own (detached) logprobs are
        the old ones: the same numbers as a separate pass, without its cost.

        `before_loss(samples, old)` runs per micro-batch with those logprobs (per sample, response
        tokens) before its loss: it may set the samples' is_weights (IS correction by clipping).

        `interrupt` (a collective every rank calls before each micro-batch) may end the mini-batch
        before its optimizer step: gradients are dropped, weights and optimizer are untouched, and
        TrainingInterrupted is raised."""
        # training mode: transformers' decoder layers recompute activations (activation_checkpointing)
        # only then; dropout is off whatever the mode (_without_dropout)
        self.model.train()
        try:
            return self._train_mini_batch(samples, old_logprobs, ref_logprobs, loss_fn, interrupt, before_loss)
        finally:
            self.model.eval()

    def _train_mini_batch(self, samples, old_logprobs, ref_logprobs, loss_fn, interrupt, before_loss):
        policy, loss_cfg = self.config.policy, self.config.loss_fn
        masks = [s.response_mask() for s in samples]
        totals = self._sum_over_data([float(sum(m.sum() for m in masks)), float(len(samples))])
        total_tokens, total_sequences = float(totals[0]), float(totals[1])
        self.optimizer.zero_grad(set_to_none=True)
        sums: dict[str, float] = {}
        loss_value = 0.0
        for batch in self._micro_batches(samples, policy.train_micro_batch_size):
            if interrupt is not None and interrupt():
                self.optimizer.zero_grad(set_to_none=True)
                raise TrainingInterrupted()
            chosen = [samples[i] for i in batch] or self._dummy()
            logprobs, entropy = self._forward_logprobs(chosen, with_entropy=True)
            share = micro_batch_loss(samples, batch, logprobs, entropy, masks, old_logprobs, ref_logprobs, loss_fn,
                                     loss_cfg, (total_tokens, total_sequences), before_loss, sums)
            # FSDP averages gradients over the ranks it shards over; scaling by their number makes it a
            # sum (over data-parallel ranks, and over the CP ranks' partial gradients of one sequence)
            (share * self.fsdp_size).backward()
            loss_value += float(share.detach())
        max_norm = policy.max_grad_norm if policy.max_grad_norm > 0 else float("inf")
        if self.tp_group is not None:
            sum_partial_gradients(self.partial_grad, self.tp_group)
            grad_norm = clip_gradients(self.trainable_parameters(), max_norm)
        else:
            grad_norm = torch.nn.utils.clip_grad_norm_(self.trainable_parameters(), max_norm)
            grad_norm = grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm
        self.optimizer.step()
        self.scheduler.step()
        reduced = self._sum_over_data([loss_value] + [sums[k] for k in sorted(sums)])
        result = {"loss": float(reduced[0]), "grad_norm": float(grad_norm), "lr": self.scheduler.get_last_lr()[0]}
        for index, name in enumerate(sorted(sums), start=1):
            result[name] = float(reduced[index]) / max(total_tokens, 1.0)
        return result

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        """Every weight, or only the LoRA adapters' (policy.lora)."""
        return [p for p in self.model.parameters() if p.requires_grad]

    def _sum_over_data(self, values: list[float]) -> torch.Tensor:
        """Sum over the data-parallel ranks (the ranks of a TP or CP group hold the same samples and figures)."""
        total = torch.tensor(values, dtype=torch.float64)
        if self.world.world_size > 1:
            dist.all_reduce(total)
        return total / self.world.model_parallel_size

    # --- weights ------------------------------------------------------------------------------

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """Full (unsharded) weights on CPU, on rank 0; every rank must call it (a collective)."""
        return get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))

    def serving_weights(self, dtype: torch.dtype) -> dict[str, torch.Tensor]:
        """What a generation server needs: full weights in `dtype`, tied aliases left out (the server
        ties them itself), on rank 0; every rank must call it. One rank holds every weight whole, so
        there is nothing to gather and the cast is the only copy."""
        if self.world.world_size == 1:
            self.model.reshard()
            local = {name: (t.to_local() if hasattr(t, "to_local") else t) for name, t in self.model.state_dict().items()}
        else:
            local = self.full_state_dict()
        if not self.world.is_main:
            return {}
        local = merged_weights(self.model, local)   # a LoRA model's servers serve base + adapters
        local = {name: tensor for name, tensor in local.items() if name not in self.alias_names}
        # under the names of the model's HF checkpoint, which servers load (transformers keeps some
        # weights fused in memory: a mixture's experts as one tensor each for gate_up and down)
        return {name: tensor.detach().to(dtype) for name, tensor in revert_weight_conversion(self.model, local).items()}

    def checkpoint_state(self) -> TorchModuleState:
        return TorchModuleState(self.model, self.optimizer, self.scheduler)

    def load_weights(self, path) -> None:
        load_model_weights(path, self.model)

    def score_data(self, packed: bool) -> None:
        self.temperature = 1.0
        if packed:
            attention = getattr(self.model.config, "_attn_implementation", None)
            if attention not in ("sdpa", "eager"):
                raise PolicySetupError(f"sft.packing needs sdpa or eager attention (a 4-D mask); "
                                       f"{self.config.policy.model_name} loads with {attention}; set sft.packing=false")
            # every conversation starts with the same template token: rows of shared "prompts" are packed rows
            self.share_prompts = True

    def base_model_reference(self) -> BaseModelReference | None:
        return BaseModelReference(self) if self.config.policy.lora.enabled else None

    def copy_weights_from(self, other: "DTensorPolicy") -> None:
        """Moving reference: same sharding on both sides, so a local copy of each shard suffices."""
        # FSDP may leave a model's parameters unsharded (plain tensors) after a no-grad forward
        for model in (self.model, other.model):
            model.reshard()
        with torch.no_grad():
            for mine, theirs in zip(self.model.parameters(), other.model.parameters()):
                local = mine.to_local() if hasattr(mine, "to_local") else mine
                local.copy_(theirs.to_local() if hasattr(theirs, "to_local") else theirs)


def _without_dropout(model: torch.nn.Module) -> None:
    """Dropout off for good: the trainer's logprobs must be those of the policy the servers sample
    from (no dropout there), in training mode too."""
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    for name in ("attention_dropout", "hidden_dropout", "dropout"):
        if isinstance(getattr(model.config, name, None), float):
            setattr(model.config, name, 0.0)
    for module in model.modules():   # attention layers copy the rate from the config when they are built
        if isinstance(getattr(module, "attention_dropout", None), float):
            module.attention_dropout = 0.0
