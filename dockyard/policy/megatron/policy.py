"""`megatron` policy backend: a megatron-core GPTModel (the local layer spec; transformer-engine's
where it imports) built from an HF folder's config and weights, tensor-parallel over
`policy.megatron_cfg.tensor_model_parallel_size` neighbouring ranks and data-parallel over the rest,
wrapped in megatron's DistributedDataParallel and trained by megatron's optimizer (its distributed
optimizer with use_distributed_optimizer). Checkpoints are megatron dist checkpoints; refit and
export go back to the HF names (convert.py)."""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist

from dockyard.config.schema import MasterConfig
from dockyard.distributed import WorldInfo
from dockyard.io.checkpoint import CheckpointLoadError, step_contents
from dockyard.model_files import folder_weights
from dockyard.models import model_folder
from dockyard.policy.base import Policy
from dockyard.policy.megatron import convert
from dockyard.policy.megatron.cpu import quiet_import, quiet_megatron, use_cpu, without_transformer_engine
from dockyard.policy.megatron.settings import unbuilt, upstream_settings
from dockyard.policy.prompt_rows import layout_rows, plan_batches
from dockyard.policy.samples import (PolicySetupError, Sample, TrainingInterrupted, lr_factor,
                                     plan_shared_prompt_rows, same_count_on_every_rank)
from dockyard.policy.tensor_parallel import VocabShard, token_logprobs
from dockyard.policy.training import micro_batch_loss

FORMAT = "megatron_dist_ckpt"
LAYOUT = "megatron_layout.json"   # beside dist_ckpt/: the world that wrote its optimizer state
# optimizer state sharded per data-parallel rank (the seed's default optimizer_sharding_type); the
# model's tensors are saved whole-tensor-addressed and load into another TP layout
_OPTIMIZER_SHARDING = {"distrib_optim_sharding_type": "dp_reshardable"}


def _hf_weights(folder: Path) -> dict[str, torch.Tensor]:
    weights = folder_weights(folder)
    if not weights:
        raise PolicySetupError(f"policy.model_name: {folder} holds no .safetensors weights for the megatron backend")
    return weights


class MegatronPolicy(Policy):
    def __init__(self, config: MasterConfig, world: WorldInfo, device: torch.device, total_optimizer_steps: int,
                 model_path: str | None = None, trainable: bool = True):
        self.config, self.world, self.device = config, world, device
        policy = config.policy
        problems = unbuilt(config)
        if problems:
            raise PolicySetupError("; ".join(f"{p.path}: {p.message}" for p in problems))
        if device.type == "cpu":
            use_cpu()
        quiet_megatron()
        without_transformer_engine()
        with quiet_import():
            from megatron.core import parallel_state
            from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
            from megatron.core.models.gpt.gpt_model import GPTModel
            from megatron.core.tensor_parallel.random import initialize_rng_tracker
        self.parallel = parallel_state
        megatron = policy.megatron_cfg
        tp, pp = megatron.tensor_model_parallel_size, megatron.pipeline_model_parallel_size
        ep = megatron.expert_model_parallel_size
        chunks = megatron.virtual_pipeline_model_parallel_size or 1
        if world.world_size % (tp * pp):
            raise PolicySetupError(f"policy.megatron_cfg: tensor_model_parallel_size {tp} x pipeline_model_parallel_size "
                                   f"{pp} does not divide the trainer world of {world.world_size} ranks")
        if world.world_size // (tp * pp) % ep:
            raise PolicySetupError(f"policy.megatron_cfg.expert_model_parallel_size {ep}: the experts split over "
                                   f"data-parallel ranks, and there are {world.world_size // (tp * pp)}")
        if not parallel_state.model_parallel_is_initialized():
            # one model's ranks are neighbours (TP innermost, then the pipeline stages), as the trainer world's
            # data ranks (WorldInfo: rank // model_parallel_size) assume
            parallel_state.initialize_model_parallel(
                tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp, expert_model_parallel_size=ep,
                order="tp-cp-ep-pp-dp",
                virtual_pipeline_model_parallel_size=megatron.virtual_pipeline_model_parallel_size)
            # dropout is off (the trainer's logprobs are the servers' policy): no per-rank RNG streams needed
            initialize_rng_tracker(inference_rng_tracker=True)
            if world.is_main and trainable:
                optimizer = "distributed optimizer" if policy.megatron_cfg.use_distributed_optimizer else "optimizer"
                stages = f" x {pp} pipeline stages" if pp > 1 else ""
                stages += f" of {chunks} model chunks each (interleaved)" if chunks > 1 else ""
                stages += f", the experts over {ep} of the data-parallel ranks" if ep > 1 else ""
                print(f"dockyard: megatron trainer mesh: {world.world_size} rank(s) = {world.world_size // (tp * pp)} "
                      f"data-parallel x {tp} tensor-parallel{stages} (megatron DDP and its {optimizer} over "
                      f"data-parallel; each model's {tp * pp} rank(s) are neighbours, tensor-parallel innermost)",
                      file=sys.stderr, flush=True)
        self.tp, self.tp_rank = tp, parallel_state.get_tensor_model_parallel_rank()
        self.tp_group = parallel_state.get_tensor_model_parallel_group()
        self.pp, self.stage = pp, parallel_state.get_pipeline_model_parallel_rank()
        self.first_stage, self.last_stage = self.stage == 0, self.stage == pp - 1
        # chunk c of this stage is virtual stage c * pp + stage of the pp x chunks the layers split into
        self.virtual_stages = [c * pp + self.stage for c in range(chunks)]
        self.pp_group = parallel_state.get_pipeline_model_parallel_group()
        self.last_stage_rank = parallel_state.get_pipeline_model_parallel_last_rank()
        self.first_stage_rank = parallel_state.get_pipeline_model_parallel_first_rank()
        self.dp_group = parallel_state.get_data_parallel_group()
        self.dp_size = parallel_state.get_data_parallel_world_size()
        self.ep, self.ep_rank = ep, parallel_state.get_expert_model_parallel_rank()
        self.ep_group = parallel_state.get_expert_model_parallel_group()
        self.folder = model_folder(model_path or policy.model_name)
        hf_config = json.loads((self.folder / "config.json").read_text())
        self.shape = convert.DecoderShape.of(hf_config, str(self.folder))
        self.shape.check_split(tp, str(self.folder))
        self.shape.check_stages(pp, str(self.folder), chunks)
        self.shape.check_experts(ep, str(self.folder))
        transformer, ddp, optimizer = upstream_settings(config, self.shape, trainable)
        self.transformer_config = transformer
        spec = get_gpt_layer_local_spec(num_experts=self.shape.experts or None, normalization="RMSNorm",
                                        qk_layernorm=self.shape.qk_norm)
        with quiet_import():
            self.gpts = [GPTModel(config=transformer, transformer_layer_spec=spec, vocab_size=self.shape.vocab,
                                  max_sequence_length=self.shape.max_positions, position_embedding_type="rope",
                                  rotary_base=self.shape.rope_theta,
                                  share_embeddings_and_output_weights=self.shape.tied, pre_process=virtual == 0,
                                  post_process=virtual == pp * chunks - 1, vp_stage=c if chunks > 1 else None)
                         for c, virtual in enumerate(self.virtual_stages)]
        self._load_hf(_hf_weights(self.folder))
        # bf16 / fp16 as megatron trains them: the model's weights in half precision (logits back in
        # fp32), the optimizer's fp32 main copies made from them
        self.models = list(self.gpts)
        if transformer.bf16 or transformer.fp16:
            from megatron.core.transformer.module import Float16Module

            self.models = [Float16Module(transformer, gpt) for gpt in self.gpts]
        self.temperature = policy.generation.temperature or 1.0
        self.share_prompts = policy.dynamic_batching.enabled and policy.dynamic_batching.share_prompts
        self.vocab = VocabShard(self.tp_rank * self.shape.vocab // tp, self.shape.vocab // tp, self.tp_group) \
            if tp > 1 else None
        self.optimizer, self.ddps = None, []
        self.optimizer_steps, self.total_optimizer_steps = 0, total_optimizer_steps
        if trainable:
            from megatron.core.distributed import DistributedDataParallel
            from megatron.core.optimizer import get_megatron_optimizer

            # megatron's own convention: a chunk after the first does not overlap its gradient reduction
            self.ddps = [DistributedDataParallel(transformer, ddp, model, disable_bucketing=c > 0)
                         for c, model in enumerate(self.models)]
            with quiet_import():
                self.optimizer = get_megatron_optimizer(optimizer, self.ddps)
            self._set_lr()
        else:
            for model in self.models:
                model.requires_grad_(False)
        for model in self.models:
            model.eval()

    # --- weights in and out -------------------------------------------------------------------

    def _load_hf(self, hf: dict[str, torch.Tensor]) -> None:
        try:
            whole = convert.to_megatron(hf, self.shape, self.tp, self.tp_rank)
            if self.shape.experts:
                whole = convert.expert_share(whole, self.shape, self.ep, self.ep_rank)
        except KeyError as err:
            raise PolicySetupError(f"{self.folder}: weight {err.args[0]} is missing for a {self.shape.family} "
                                   "model") from None
        for gpt, virtual in zip(self.gpts, self.virtual_stages):
            state = convert.stage_of(whole, self.shape, self.pp * len(self.gpts), virtual)
            own = {name for name in gpt.state_dict() if not name.endswith("_extra_state")}
            missing, unexpected = sorted(own - set(state)), sorted(set(state) - own)
            if missing or unexpected:
                raise PolicySetupError(f"{self.folder}: the megatron model and the converted weights differ "
                                       f"(missing {missing[:3]}, unexpected {unexpected[:3]})")
            with torch.no_grad():
                for name, tensor in gpt.state_dict().items():
                    if name in state:
                        tensor.copy_(state[name].to(tensor.dtype))

    def _gathered_hf(self) -> dict[str, torch.Tensor]:
        """Full HF weights on rank 0 (every rank calls it; the expert-parallel ranks gather their experts,
        the TP groups their shards, then the pipeline stages send theirs to the first stage)."""
        chunks = []   # per model chunk of this stage: its shards of every TP rank
        for gpt in self.gpts:
            local = {name: t.detach() for name, t in gpt.state_dict().items() if not name.endswith("_extra_state")}
            if self.ep > 1:
                shares = [None] * self.ep
                dist.all_gather_object(shares, local, group=self.ep_group)
                local = convert.all_experts(shares, self.shape)
            if self.tp == 1:
                chunks.append([local])
                continue
            shards = [{} for _ in range(self.tp)]
            for name, tensor in local.items():
                parts = [torch.empty_like(tensor) for _ in range(self.tp)]
                dist.all_gather(parts, tensor.contiguous(), group=self.tp_group)
                for rank, part in enumerate(parts):
                    shards[rank][name] = part
            chunks.append(shards)
        stages = [chunks]
        if self.pp > 1:
            stages = [None] * self.pp if self.first_stage else None
            dist.gather_object(chunks, stages, dst=self.first_stage_rank, group=self.pp_group)
            if not self.first_stage:
                return {}
        # virtual stage c * pp + s is chunk c of stage s
        in_order = [stages[s][c] for c in range(len(self.gpts)) for s in range(self.pp)]
        shards = [convert.whole_model([virtual[rank] for virtual in in_order], self.shape) for rank in range(self.tp)]
        if not self.world.is_main:
            return {}
        return convert.to_hf(shards, self.shape)

    def serving_weights(self, dtype: torch.dtype) -> dict[str, torch.Tensor]:
        return {name: tensor.to(dtype) for name, tensor in self._gathered_hf().items()}

    def hf_weights(self) -> dict[str, torch.Tensor]:
        """For exports: float32 (a bf16 model's weights are its main copies rounded, as megatron keeps them)."""
        return {name: tensor.float() for name, tensor in self._gathered_hf().items()}

    def copy_weights_from(self, other: "MegatronPolicy") -> None:
        with torch.no_grad():
            for model, other_model in zip(self.models, other.models):
                for mine, theirs in zip(model.parameters(), other_model.parameters()):
                    mine.copy_(theirs)

    def load_weights(self, path) -> None:
        """A saved step's weights: its dist checkpoint when it holds one of this backend, else its HF export."""
        from dockyard.models import checkpoint_weights_folder

        folder = checkpoint_weights_folder(path)
        held = step_contents(folder)
        if held["format"] == FORMAT and held["dcp"] and (folder / "dist_ckpt").is_dir():
            MegatronState(self).load_model_only(folder)
        elif (folder / "hf" / "model.safetensors").is_file():
            self._load_hf(_hf_weights(folder / "hf"))
        else:
            raise CheckpointLoadError(f"{folder} holds neither a megatron dist checkpoint nor an HF export "
                                      "(checkpointing.export_hf) this backend can load")

    def checkpoint_state(self) -> "MegatronState":
        return MegatronState(self)

    def score_data(self, packed: bool) -> None:
        self.temperature = 1.0
        # every conversation starts with the same template token: rows of shared "prompts" are packed rows
        # (the block mask keeps each conversation to itself, _rotary_at restarts its positions)
        self.share_prompts = self.share_prompts or packed

    # --- forward ------------------------------------------------------------------------------

    def _layout(self, samples: list[Sample]):
        """Rows of one sample each, or a prompt once and several of its responses
        (policy.dynamic_batching.share_prompts; prompt_rows.py): the mask hides padding keys and every
        other response, so no token sees another sequence's or the padding's."""
        rows = plan_shared_prompt_rows(samples, self.config.policy.dynamic_batching.max_tokens_per_gpu) \
            if self.share_prompts else [[index] for index in range(len(samples))]
        return layout_rows(samples, rows)

    def _stage_forward(self, chunk: int, layout):
        """A model chunk's forward of a micro-batch: hidden states for the next (virtual) stage, or on the
        last one the logits of the positions that predict a response token ([1, n, vocab / TP])."""
        gpt = self.gpts[chunk]
        picked_only = _output_layer_on(gpt, layout.source_pos.to(self.device), layout.source_row.to(self.device)) \
            if gpt.post_process else contextlib.nullcontext()
        with picked_only, _rotary_at(gpt, layout.positions.to(self.device)):
            return self.models[chunk](layout.ids.to(self.device), layout.positions.to(self.device),
                                      (~layout.allowed).to(self.device))

    def _token_logprobs(self, layout, output, with_entropy: bool):
        """Right-aligned [B, R] logprobs (and entropy) from the last stage's output."""
        flat, flat_entropy = token_logprobs(output[0], layout.targets.to(self.device), self.temperature,
                                            with_entropy, self.vocab)
        return layout.scatter(flat), (layout.scatter(flat_entropy) if with_entropy else None)

    def _run_schedule(self, samples: list[Sample], batches: list[list[int]], on_logits, forward_only: bool,
                      before_each: Callable[[], None] | None = None) -> None:
        """Every micro-batch through megatron's schedule (1F1B over the pipeline stages; forward and backward
        in turn without one): `on_logits(batch, layout, output)` runs on the last stage and returns the
        micro-batch's loss (training) or anything (forward_only); `before_each` before each forward."""
        from megatron.core.pipeline_parallel import get_forward_backward_func

        chunks = self.ddps or self.models
        layouts = [self._layout([samples[i] for i in batch] or [Sample(token_ids=[0, 0], prompt_length=1)])
                   for batch in batches]
        rows, width = max(l.ids.shape[0] for l in layouts), max(l.ids.shape[1] for l in layouts)
        if len(chunks) > 1:   # one shape for all (_pipeline_settings)
            layouts = [layout.padded(rows, width) for layout in layouts]

        def forward_step(data_iterator, model):
            chunk = next(c for c, candidate in enumerate(chunks) if candidate is model)
            if before_each is not None:
                before_each()
            index = next(data_iterator)
            batch, layout = batches[index], layouts[index]
            output = self._stage_forward(chunk, layout)

            def loss_func(output_tensor):
                loss = on_logits(batch, layout, output_tensor)
                return (loss if loss is not None else output_tensor.sum() * 0.0), {}

            return output, loss_func

        # each model chunk takes every micro-batch in turn, from its own iterator
        iterators = [iter(range(len(batches))) for _ in chunks] if len(chunks) > 1 else iter(range(len(batches)))
        get_forward_backward_func()(forward_step_func=forward_step, data_iterator=iterators, model=chunks,
                                    num_microbatches=len(batches), seq_length=width, micro_batch_size=rows,
                                    forward_only=forward_only)

    def _from_last_stage(self, value):
        """`value` of the last pipeline stage on every stage of this pipeline."""
        if self.pp == 1:
            return value
        box = [value if self.last_stage else None]
        dist.broadcast_object_list(box, src=self.last_stage_rank, group=self.pp_group)
        return box[0]

    def _micro_batches(self, samples: list[Sample], micro_size: int) -> list[list[int]]:
        """Every rank of the world gets the same number (empty ones pad): a forward is a TP collective."""
        batches = plan_batches(samples, micro_size, self.config.policy.dynamic_batching, self.share_prompts)
        batches = same_count_on_every_rank(batches)
        if len(self.gpts) > 1:
            # the interleaved schedule runs micro-batches in groups of pp (empty ones pad the last group)
            batches += [[] for _ in range(max(self.pp, -(-len(batches) // self.pp) * self.pp) - len(batches))]
        return batches

    @torch.no_grad()
    def logprobs(self, samples: list[Sample]) -> list[torch.Tensor]:
        policy = self.config.policy
        out: list[torch.Tensor | None] = [None] * len(samples)

        def keep(batch, layout, output):
            logprobs, _ = self._token_logprobs(layout, output, with_entropy=False)
            for row, index in enumerate(batch):
                out[index] = logprobs[row, logprobs.shape[1] - samples[index].response_length:].cpu()

        self._run_schedule(samples, self._micro_batches(samples, policy.logprob_batch_size or
                                                        policy.train_micro_batch_size), keep, forward_only=True)
        return self._from_last_stage(out)

    # --- training -----------------------------------------------------------------------------

    def _set_lr(self) -> None:
        sched = self.config.policy.scheduler
        lr = self.config.policy.optimizer.lr * lr_factor(self.optimizer_steps, sched.warmup_steps,
                                                         self.total_optimizer_steps, sched.name, sched.min_lr_ratio)
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def train_mini_batch(self, samples: list[Sample], old_logprobs, ref_logprobs, loss_fn,
                         interrupt: Callable[[], bool] | None = None, before_loss=None) -> dict[str, float]:
        """One optimizer step. A stop is asked for before the first micro-batch only when the model has
        pipeline stages (each stage runs its micro-batches at its own time in the schedule), else before each."""
        from megatron.core.distributed import finalize_model_grads

        policy, loss_cfg = self.config.policy, self.config.loss_fn
        masks = [s.response_mask() for s in samples]
        totals = self._sum_over_data([float(sum(m.sum() for m in masks)), float(len(samples))])
        batches = self._micro_batches(samples, policy.train_micro_batch_size)
        sums: dict[str, float] = {}
        loss_value = [0.0]
        seen_before_loss: list[tuple[list[int], list[torch.Tensor]]] = []

        def stop_if_asked():
            if interrupt():
                raise TrainingInterrupted()

        def loss_of(batch, layout, output):
            def recorded_before_loss(batch_samples, batch_old):
                seen_before_loss.append((batch, batch_old))
                before_loss(batch_samples, batch_old)

            logprobs, entropy = self._token_logprobs(layout, output, with_entropy=True)
            share = micro_batch_loss(samples, batch, logprobs, entropy, masks, old_logprobs, ref_logprobs, loss_fn,
                                     loss_cfg, (float(totals[0]), float(totals[1])),
                                     recorded_before_loss if before_loss is not None else None, sums)
            loss_value[0] += float(share.detach())
            # megatron's DDP averages gradients over the data-parallel ranks and its schedule divides each
            # micro-batch's loss by their count; the share is already a fraction of the whole mini-batch
            return share * self.dp_size * len(batches)

        if interrupt is not None and self.pp > 1:
            stop_if_asked()
        for ddp in self.ddps:
            ddp.train()
            ddp.zero_grad_buffer()
        self.optimizer.zero_grad()
        try:
            try:
                self._run_schedule(samples, batches, loss_of, forward_only=False,
                                   before_each=stop_if_asked if interrupt is not None and self.pp == 1 else None)
            except TrainingInterrupted:
                for ddp in self.ddps:
                    ddp.zero_grad_buffer()
                raise
            # the data-parallel reduction, and the sums megatron owes replicated weights that see part of the
            # model per TP rank (Qwen3's q/k norms) or that are shared between pipeline stages (tied embeddings)
            finalize_model_grads(self.ddps)
            succeeded, grad_norm, _ = self.optimizer.step()
        finally:
            for ddp in self.ddps:
                ddp.eval()
        if not succeeded:
            raise RuntimeError("megatron's optimizer skipped the step (a gradient was not finite)")
        self.optimizer_steps += 1
        lr = self.optimizer.param_groups[0]["lr"]
        self._set_lr()
        loss, sums, seen = self._from_last_stage((loss_value[0], sums, seen_before_loss))
        if before_loss is not None and not self.last_stage:
            # the loop's safeguard figures are kept by rank 0, which is the first stage: the same calls there
            for indices, batch_old in seen:
                before_loss([samples[i] for i in indices], batch_old)
        reduced = self._sum_over_data([loss] + [sums[k] for k in sorted(sums)])
        result = {"loss": float(reduced[0]), "grad_norm": float(grad_norm if grad_norm is not None else 0.0),
                  "lr": lr}
        for index, name in enumerate(sorted(sums), start=1):
            result[name] = float(reduced[index]) / max(float(totals[0]), 1.0)
        return result

    def _sum_over_data(self, values: list[float]) -> torch.Tensor:
        total = torch.tensor(values, dtype=torch.float64)
        if self.dp_size > 1:
            dist.all_reduce(total, group=self.dp_group)
        return total


@contextlib.contextmanager
def _output_layer_on(gpt, positions: torch.Tensor, rows: torch.Tensor):
    """The output layer (the vocabulary projection, most of a small model's compute) runs on the
    hidden states of the given (position, row) pairs only, as one [n, 1, hidden] batch: GPTModel
    then returns [1, n, vocab / TP] logits instead of [rows, positions, vocab / TP]."""
    def select(module, args, kwargs):
        hidden = args[0]   # [positions, rows, hidden]: megatron is sequence-first
        return (hidden[positions, rows][:, None], *args[1:]), kwargs

    handle = gpt.output_layer.register_forward_pre_hook(select, with_kwargs=True)
    try:
        yield
    finally:
        handle.remove()


@contextlib.contextmanager
def _rotary_at(gpt, positions: torch.Tensor):
    """RoPE at the given [rows, width] positions. GPTModel builds its rotary table for 0..width-1 and
    ignores position_ids; a shared-prompt row's responses each restart after the prompt."""
    def gather(module, args, table):
        # [width, 1, 1, dim] -> [width, rows, 1, dim], which the attention broadcasts over its heads
        return table[:, 0, 0][positions.t()][:, :, None]

    handle = gpt.rotary_pos_emb.register_forward_hook(gather)
    try:
        yield
    finally:
        handle.remove()


def _chunk_key(chunk: int) -> str:
    return "model" if chunk == 0 else f"model{chunk}"


class MegatronState:
    """A megatron policy's weights and (distributed) optimizer as a megatron dist checkpoint under
    dist_ckpt/, and its learning-rate position."""

    format = FORMAT
    adapters_only = False

    def __init__(self, policy: MegatronPolicy):
        self.policy = policy

    def _sharded(self, with_optimizer: bool, loading: bool) -> dict[str, Any]:
        # model chunks as megatron names them ("model", "model1", ...); the tensors inside are addressed by
        # their global layer, so a step loads into any other pipeline layout
        model = {_chunk_key(c): chunk.sharded_state_dict() for c, chunk in enumerate(self.policy.models)}
        state = dict(model)
        if with_optimizer and self._optimizer_keeps_state():
            state["optimizer"] = self.policy.optimizer.sharded_state_dict(model, is_loading=loading,
                                                                          metadata=_OPTIMIZER_SHARDING)
        return state

    def save(self, folder: Path, with_optimizer: bool) -> None:
        import queue

        from megatron.core import dist_checkpointing
        from megatron.core.dist_checkpointing.strategies import filesystem_async

        # megatron collects its writers' results through a queue served by a spawned manager process,
        # made for saves that finish in a background process; this save is synchronous (the results are
        # read in this process), and that manager would outlive a trainer killed by a preemption
        if filesystem_async._results_queue is None:
            filesystem_async._results_queue = queue.Queue()

        target = folder / "dist_ckpt"
        if self.policy.world.is_main:
            target.mkdir()
            (folder / LAYOUT).write_text(json.dumps(self._layout()))
        dist.barrier()
        dist_checkpointing.save(self._sharded(with_optimizer, loading=False), str(target))

    def load(self, folder: Path, held: dict[str, Any]) -> None:
        from megatron.core import dist_checkpointing
        from torch.distributed.checkpoint.api import CheckpointException

        if not held["dcp"]:
            self.policy._load_hf(_hf_weights(folder / "hf"))
            return
        with_optimizer = held["optimizer"] and self.policy.optimizer is not None
        if with_optimizer:
            saved = json.loads((folder / LAYOUT).read_text()) if (folder / LAYOUT).is_file() else None
            if saved is not None:   # steps written before pipeline stages and experts were built had one of each
                saved = {"pipeline_model_parallel_size": 1, "virtual_pipeline_model_parallel_size": 1,
                         "expert_model_parallel_size": 1, **saved}
            if saved != self._layout():
                raise CheckpointLoadError(
                    f"{folder}: its optimizer state was saved by a megatron world of {saved}, and this run is "
                    f"{self._layout()}; megatron's dp_reshardable optimizer state loads only into the same "
                    "tensor-parallel, pipeline and data-parallel layout (the weights load into any: use the step as "
                    "loss_fn.reference_model.checkpoint_path, or resume from its HF export as policy.model_name)")
            if self._optimizer_keeps_state():
                self._fill_empty_optimizer_state()
        try:
            loaded = dist_checkpointing.load(self._sharded(with_optimizer, loading=True), str(folder / "dist_ckpt"))
        except (Exception, CheckpointException) as err:   # megatron's, and DCP's per-rank BaseExceptions
            lines = [line.strip() for line in str(err).strip().splitlines() if line.strip()]
            raise CheckpointLoadError(f"{folder / 'dist_ckpt'} cannot be loaded into this model: "
                                      f"{lines[-1][:600] if lines else type(err).__name__}") from None
        for c, chunk in enumerate(self.policy.models):
            chunk.load_state_dict(loaded[_chunk_key(c)], strict=False)
        if with_optimizer and "optimizer" in loaded:
            with torch.no_grad():   # the fp32 parameters are the optimizer's own main copies
                self.policy.optimizer.load_state_dict(loaded["optimizer"])
            self._restore_step_counts()

    def _optimizer_keeps_state(self) -> bool:
        # plain SGD keeps none (and megatron 0.16 cannot load an SGD's: it has no state initialiser for it)
        return self.policy.optimizer is not None and self.policy.config.policy.optimizer.name != "sgd"

    def _layout(self) -> dict[str, Any]:
        megatron = self.policy.config.policy.megatron_cfg
        return {"tensor_model_parallel_size": self.policy.tp, "pipeline_model_parallel_size": self.policy.pp,
                "virtual_pipeline_model_parallel_size": len(self.policy.models),
                "data_parallel_size": self.policy.dp_size, "expert_model_parallel_size": self.policy.ep,
                "use_distributed_optimizer": megatron.use_distributed_optimizer}

    def _fill_empty_optimizer_state(self) -> None:
        """A fresh optimizer has no moments yet, and megatron's loader reads into existing ones (with a
        step count per parameter, as torch's Adam keeps it): zeros, overwritten by the load."""
        for chained in getattr(self.policy.optimizer, "chained_optimizers", [self.policy.optimizer]):
            inner = chained.optimizer
            for group in inner.param_groups:
                for parameter in group["params"]:
                    if not inner.state[parameter]:
                        inner.state[parameter] = {"step": torch.tensor(0.0),
                                                  "exp_avg": torch.zeros_like(parameter),
                                                  "exp_avg_sq": torch.zeros_like(parameter)}

    def _restore_step_counts(self) -> None:
        """megatron 0.16's dp_reshardable load leaves torch Adam's per-parameter step counts at zero (one
        shared tensor) while the parameter groups hold the saved step; the bias correction needs it."""
        for chained in getattr(self.policy.optimizer, "chained_optimizers", [self.policy.optimizer]):
            inner = chained.optimizer
            for group in inner.param_groups:
                for parameter in group["params"]:
                    if "step" in group and inner.state[parameter]:
                        inner.state[parameter]["step"] = torch.tensor(float(group["step"]))

    def load_model_only(self, folder: Path) -> None:
        self.load(folder, {"dcp": True, "optimizer": False})

    def hf_weights(self) -> dict[str, torch.Tensor]:
        return self.policy.hf_weights()

    def scheduler_state(self) -> dict[str, Any]:
        return {"optimizer_steps": self.policy.optimizer_steps}

    def load_scheduler_state(self, state: dict[str, Any]) -> None:
        self.policy.optimizer_steps = int(state["optimizer_steps"])
        if self.policy.optimizer is not None:
            self.policy._set_lr()
