"""`jax` policy backend: a Flax NNX decoder (model.py) built from an HF folder, its weights sharded over
a device mesh `data x model` (policy.jax_cfg.mesh) with jax.sharding, trained by jitted steps with
optax, checkpointed with orbax and refitted to the generation servers under the HF names.

The mesh spans the trainer processes' devices (one JAX world over several processes, jax.distributed):
on GPUs each process's GPUs, on CPU host devices made by XLA (--xla_force_host_platform_device_count,
set before JAX starts its backend). XLA partitions each jitted step over the mesh from the weights'
and the batch's shardings (GSPMD): the `model` axis splits heads, MLP width and vocabulary as
Megatron does, the `data` axis the rows, each process contributing its samples' rows.

Shapes are bucketed (rows to multiples of 8, widths to multiples of 64 / 16) so that a run compiles a
handful of step programs, which the persistent compilation cache keeps across requeues."""

from __future__ import annotations

import json
import logging
import math
import os
import sys
from functools import partial
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from dockyard.config.schema import MasterConfig
from dockyard.config.topology import jax_mesh_line
from dockyard.distributed import WorldInfo
from dockyard.errors import ComponentError
from dockyard.io.checkpoint import CheckpointLoadError, step_contents
from dockyard.models import model_folder
from dockyard.policy.base import Policy
from dockyard.policy.decoder_shape import DecoderShape
from dockyard.policy.jax.settings import unbuilt
from dockyard.policy.samples import (PolicySetupError, Sample, TrainingInterrupted, lr_factor, plan_micro_batches,
                                     same_count_on_every_rank)

FORMAT = "orbax"
LAYOUT = "jax_layout.json"   # beside orbax/: the mesh that wrote it (informative: orbax reshards on load)
_WIDTH, _RESPONSES = 64, 16   # sequence and response widths are padded to multiples of these


_distributed_started = False
_JOIN_TIMEOUT_S = 300   # for every trainer process to reach JAX's coordinator


def _start_jax(devices: int, platform: str, world: WorldInfo):
    """JAX with `devices` devices in all, over the trainer world's processes. On CPU each process makes
    its share as host devices when JAX starts its backend, so the flag must be in XLA_FLAGS before
    that; a process whose JAX started already keeps its count. Several processes join one JAX world
    (jax.distributed): the coordinator on trainer rank 0's host (MASTER_ADDR, as torch.distributed),
    process ids from the ranks, CPU collectives over gloo."""
    global _distributed_started
    if devices % world.world_size:
        raise PolicySetupError(f"policy.jax_cfg.mesh: data x model = {devices} devices do not divide over "
                               f"{world.world_size} trainer processes")
    local = devices // world.world_size
    if platform == "cpu":
        flags = os.environ.get("XLA_FLAGS", "")
        if "--xla_force_host_platform_device_count" not in flags:
            os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={local}".strip()
    import jax

    if platform == "cpu":
        # not JAX_PLATFORMS: transformers may have imported JAX (and read its environment) already
        jax.config.update("jax_platforms", "cpu")
    # orbax logs every array it writes at INFO through absl
    logging.getLogger("absl").setLevel(logging.WARNING)
    if world.world_size > 1 and not _distributed_started:
        if platform == "cpu":
            jax.config.update("jax_cpu_collectives_implementation", "gloo")
        # JAX's preemption service takes SIGTERM for itself: dockyard's handler must see it to save and requeue
        jax.config.update("jax_enable_preemption_service", False)
        address = f"{os.environ.get('MASTER_ADDR', '127.0.0.1')}:{_agreed_port(world)}"
        try:
            jax.distributed.initialize(coordinator_address=address, num_processes=world.world_size,
                                       process_id=world.rank, initialization_timeout=_JOIN_TIMEOUT_S)
        except Exception as err:   # XLA's runtime errors; the trainer prints this one without a traceback
            raise ComponentError(f"trainer rank {world.rank}: the JAX world of {world.world_size} processes did not "
                                 f"form within {_JOIN_TIMEOUT_S} s at the coordinator {address} (trainer rank 0): "
                                 f"{str(err).strip().splitlines()[-1][:400] if str(err).strip() else type(err).__name__}"
                                 ) from None
        _distributed_started = True
    available = jax.devices()
    if len(available) < devices:
        raise PolicySetupError(f"policy.jax_cfg.mesh: data x model = {devices} devices, and this JAX world has "
                               f"{len(available)} ({available[0].platform}); "
                               + ("its host device count was fixed when JAX started (XLA_FLAGS "
                                  f"{os.environ.get('XLA_FLAGS', '')!r})" if platform == "cpu" else
                                  "ask for as many GPUs per trainer task"))
    return jax


def _agreed_port(world: WorldInfo) -> int:
    """A free port on rank 0's host for JAX's coordinator, sent to every rank over torch.distributed."""
    import torch.distributed as dist

    from dockyard.distributed import free_port

    chosen = [free_port() if world.is_main else None]
    dist.broadcast_object_list(chosen, src=0)
    return int(chosen[0])


def _bucket(n: int, step: int) -> int:
    return max(step, -(-n // step) * step)


def _rows_bucket(n: int, data: int) -> int:
    """Rows padded to a multiple of 8 (few compiled shapes) and of this process's share of the data axis."""
    return _bucket(n, math.lcm(8, data))


class JaxPolicy(Policy):
    def __init__(self, config: MasterConfig, world: WorldInfo, device: torch.device, total_optimizer_steps: int,
                 model_path: str | None = None, trainable: bool = True):
        self.config, self.world = config, world
        policy = config.policy
        problems = unbuilt(config, planned_world=False)
        if problems:
            raise PolicySetupError("; ".join(f"{p.path}: {p.message}" for p in problems))
        settings = policy.jax_cfg
        data, model = settings.mesh.data, settings.mesh.model
        jax = _start_jax(data * model, "gpu" if device.type == "cuda" else "cpu", world)
        from jax.sharding import Mesh, NamedSharding, PartitionSpec

        from dockyard.policy.jax.params import Weights, hf_tensors

        self.jax, self.hf_tensors = jax, hf_tensors
        self._cache(settings.compilation_cache_dir)
        self.mesh = Mesh(np.array(jax.devices()[:data * model]).reshape(data, model), ("data", "model"))
        self.data = data
        self.rows = NamedSharding(self.mesh, PartitionSpec("data"))
        self.replicated = NamedSharding(self.mesh, PartitionSpec())
        self.folder = model_folder(model_path or policy.model_name)
        self.shape = DecoderShape.of(json.loads((self.folder / "config.json").read_text()), str(self.folder), "jax")
        self.shape.check_split(model, str(self.folder), "policy.jax_cfg.mesh.model", "devices")
        self.weights = Weights(self.shape, remat=settings.remat and trainable)
        self.shardings = self.weights.shardings(self.mesh)
        self.params = self._placed(self.weights.from_hf(hf_tensors(self.folder), str(self.folder)))
        self.compute_dtype = jax.numpy.bfloat16 if policy.precision == "bf16" else jax.numpy.float32
        self.temperature = policy.generation.temperature or 1.0
        self.optimizer = self.opt_state = None
        self.optimizer_steps, self.total_optimizer_steps = 0, total_optimizer_steps
        if trainable:
            self.optimizer = self._optimizer()
            self.opt_state = jax.jit(self.optimizer.init, out_shardings=self._state_shardings())(self.params)
        if world.is_main and trainable:
            line = jax_mesh_line(data, model, jax.devices()[0].platform, world.world_size)
            print(f"dockyard: {line}", file=sys.stderr, flush=True)

    # --- set-up -------------------------------------------------------------------------------

    def _cache(self, setting: str | None) -> None:
        if setting is None:
            return
        folder = Path(self.config.checkpointing.checkpoint_dir) / "jax_compilation_cache" if setting == "auto" \
            else Path(setting)
        folder.mkdir(parents=True, exist_ok=True)
        self.jax.config.update("jax_compilation_cache_dir", str(folder))
        # CPU steps of a small model compile in well under a second each; keep them all
        self.jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
        self.jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)

    def _placed(self, params: dict[str, np.ndarray]) -> dict[str, Any]:
        """Host weights (the same on every process) as global arrays in their shardings."""
        return {name: self.jax.make_array_from_callback(value.shape, self.shardings[name],
                                                        lambda index, value=value: value[index])
                for name, value in params.items()}

    def _state_shardings(self):
        """The optimizer state's shardings: its per-weight moments as the weights, its scalars replicated."""
        import jax

        def sharding(path, leaf):
            names = [key.key for key in path if isinstance(key, jax.tree_util.DictKey)]
            return self.shardings[names[-1]] if names and names[-1] in self.shardings else self.replicated
        return jax.tree_util.tree_map_with_path(sharding, jax.eval_shape(self.optimizer.init, self.params))

    def _optimizer(self):
        import optax

        opt = self.config.policy.optimizer
        if opt.name == "sgd":
            # torch's SGD: weight decay as L2 in the gradient, then the plain step
            def sgd(learning_rate):
                return optax.chain(optax.add_decayed_weights(opt.weight_decay), optax.sgd(learning_rate))
            return optax.inject_hyperparams(sgd)(learning_rate=opt.lr)
        return optax.inject_hyperparams(optax.adamw)(learning_rate=opt.lr, b1=opt.betas[0], b2=opt.betas[1],
                                                     eps=opt.eps, weight_decay=opt.weight_decay)

    def _lr(self) -> float:
        sched = self.config.policy.scheduler
        return self.config.policy.optimizer.lr * lr_factor(self.optimizer_steps, sched.warmup_steps,
                                                           self.total_optimizer_steps, sched.name, sched.min_lr_ratio)

    # --- batches ------------------------------------------------------------------------------

    def _shape(self, samples: list[Sample]) -> tuple[int, int, int]:
        """(rows, width, responses) of a micro-batch's arrays on this process: its samples' padded, and the
        same on every process (each contributes its rows to one global batch)."""
        local = [len(samples), max((len(s.token_ids) for s in samples), default=1),
                 max((s.response_length for s in samples), default=1)]
        if self.world.world_size > 1:
            import torch.distributed as dist

            agreed = torch.tensor(local, dtype=torch.long)
            dist.all_reduce(agreed, op=dist.ReduceOp.MAX)
            local = agreed.tolist()
        return (_rows_bucket(local[0], max(1, self.data // self.world.world_size)), _bucket(local[1], _WIDTH),
                _bucket(max(1, local[2]), _RESPONSES))

    def _layout(self, samples: list[Sample]) -> dict[str, np.ndarray]:
        """Right-padded rows (each sequence from position 0; padding keys hidden), and for each sample its
        response tokens as a right-aligned [rows, R] block: the position predicting each, and the token."""
        rows, width, responses = self._shape(samples)
        ids = np.zeros((rows, width), np.int32)
        real = np.zeros((rows, width), bool)
        where = np.zeros((rows, responses), np.int32)
        targets = np.zeros((rows, responses), np.int32)
        present = np.zeros((rows, responses), np.float32)
        for row, sample in enumerate(samples):
            n, length = sample.response_length, len(sample.token_ids)
            ids[row, :length] = sample.token_ids
            real[row, :length] = True
            where[row, responses - n:] = np.arange(sample.prompt_length - 1, length - 1)
            targets[row, responses - n:] = sample.token_ids[sample.prompt_length:]
            present[row, responses - n:] = 1.0
        if ids.size and int(ids.max()) >= self.shape.vocab:
            # a gather in JAX clamps an index out of range instead of failing: it would train on another token
            raise ValueError(f"token id {int(ids.max())} is outside {self.folder}'s vocabulary of {self.shape.vocab} "
                             "(a tokenizer with tokens the model has no embedding for?)")
        allowed = np.tril(np.ones((width, width), bool))[None] & real[:, None, :]
        allowed |= np.eye(width, dtype=bool)[None]     # a padding query attends to itself: no empty softmax
        return {"ids": ids, "positions": np.broadcast_to(np.arange(width, dtype=np.int32), (rows, width)).copy(),
                "allowed": allowed, "where": where, "targets": targets, "present": present}

    def _rows_of(self, values: list[torch.Tensor | list[float] | None], rows: int, responses: int,
                 fill: float = 0.0) -> np.ndarray:
        """Per-sample response rows laid out right-aligned as [rows, responses] (float32)."""
        out = np.full((rows, responses), fill, np.float32)
        for row, value in enumerate(values):
            if value is None:
                continue
            array = np.asarray(value.numpy() if isinstance(value, torch.Tensor) else value, np.float32)
            if array.shape[0]:
                out[row, responses - array.shape[0]:] = array
        return out

    def _put(self, batch: dict[str, np.ndarray]) -> dict[str, Any]:
        """This process's rows as its part of global arrays split over the `data` axis."""
        return {name: self.jax.make_array_from_process_local_data(self.rows, value) for name, value in batch.items()}

    def _local_rows(self, array) -> np.ndarray:
        """This process's rows of a global array split over `data` (each row block once)."""
        blocks = {shard.index[0].start or 0: shard.data for shard in array.addressable_shards}
        return np.concatenate([np.asarray(blocks[start]) for start in sorted(blocks)])

    # --- logprobs -----------------------------------------------------------------------------

    def logprobs(self, samples: list[Sample]) -> list[torch.Tensor]:
        policy = self.config.policy
        out: list[torch.Tensor | None] = [None] * len(samples)
        for batch in self._micro_batches(samples, policy.logprob_batch_size or policy.train_micro_batch_size):
            layout = self._layout([samples[i] for i in batch])
            logprobs = self._local_rows(_logprobs_step(self.weights, self.compute_dtype, self.temperature,
                                                       self.params, self._put(layout)))
            for row, index in enumerate(batch):
                n = samples[index].response_length
                out[index] = torch.from_numpy(logprobs[row, logprobs.shape[1] - n:].copy())
        return out

    def _micro_batches(self, samples: list[Sample], micro_size: int) -> list[list[int]]:
        """As the torch backends plan them, with each length counted as its padded width: the token budget
        bounds the rows a step program really computes."""
        budget = self.config.policy.dynamic_batching
        batches = plan_micro_batches([_bucket(len(s.token_ids), _WIDTH) for s in samples], micro_size,
                                     budget.max_tokens_per_gpu if budget.enabled else None)
        # each micro-batch is one global batch of every process's rows: as many on every process
        return same_count_on_every_rank(batches) if self.world.world_size > 1 else batches

    # --- training -----------------------------------------------------------------------------

    def train_mini_batch(self, samples: list[Sample], old_logprobs, ref_logprobs, loss_fn,
                         interrupt: Callable[[], bool] | None = None, before_loss=None) -> dict[str, float]:
        from dockyard.policy.jax.losses import LossSettings

        jax = self.jax
        policy = self.config.policy
        settings = LossSettings.of_loss(loss_fn, self.config.loss_fn)
        masks = [s.response_mask() for s in samples]
        totals = torch.tensor([float(sum(float(m.sum()) for m in masks)), float(len(samples))], dtype=torch.float64)
        if self.world.world_size > 1:   # the loss is a share of the whole mini-batch, every process's rows
            import torch.distributed as dist

            dist.all_reduce(totals)
        totals = totals.numpy().astype(np.float32)
        grads = None
        loss_value, sums = 0.0, {}
        for batch in self._micro_batches(samples, policy.train_micro_batch_size):
            if interrupt is not None and interrupt():
                raise TrainingInterrupted()
            chosen = [samples[i] for i in batch]
            layout = self._layout(chosen)
            rows, responses = layout["where"].shape
            old = [old_logprobs[i] for i in batch] if old_logprobs is not None else None
            if before_loss is not None:
                if old is None:   # the weights have not moved: the old logprobs are the current ones
                    old = self.logprobs(chosen)   # every process: a collective, also for an empty share
                if chosen:
                    before_loss(chosen, old)
            inputs = dict(layout)
            inputs["mask"] = self._rows_of([masks[i] for i in batch], rows, responses)
            inputs["advantages"] = self._rows_of(
                [s.token_advantages if s.token_advantages is not None else [s.advantage] * s.response_length
                 for s in chosen], rows, responses)
            inputs["is_weights"] = self._rows_of([s.is_weights for s in chosen], rows, responses, fill=1.0)
            inputs["old"] = self._rows_of(old, rows, responses) if old is not None else None
            inputs["ref"] = self._rows_of([ref_logprobs[i] for i in batch], rows, responses) \
                if ref_logprobs is not None and settings.kl_penalty > 0 else None
            inputs = {k: v for k, v in inputs.items() if v is not None}
            (share, metrics), micro_grads = _grad_step(self.weights, self.compute_dtype, self.temperature, settings,
                                                       self.params, self._put(inputs), totals)
            grads = micro_grads if grads is None else _add(grads, micro_grads)
            loss_value += float(share)
            for name, value in metrics.items():
                sums[name] = sums.get(name, 0.0) + float(value)
        lr = self._lr()
        max_norm = policy.max_grad_norm if policy.max_grad_norm > 0 else float("inf")
        self.params, self.opt_state, grad_norm = _apply_step(self.optimizer, self.params, self.opt_state, grads,
                                                             np.float32(lr), np.float32(max_norm))
        self.optimizer_steps += 1
        result = {"loss": loss_value, "grad_norm": float(grad_norm), "lr": lr}
        for name in sorted(sums):
            result[name] = sums[name] / max(float(totals[0]), 1.0)
        return result

    # --- weights in and out -------------------------------------------------------------------

    def hf_weights(self) -> dict[str, torch.Tensor]:
        """float32 weights under the HF names (the tied LM head is the embedding, as HF saves it), on rank
        0 ({} on the others); every process takes part in gathering the weights split over processes."""
        from jax.experimental import multihost_utils

        out = {}
        for name, value in self.params.items():
            whole = np.array(value if value.is_fully_addressable else
                             multihost_utils.process_allgather(value, tiled=True), np.float32)
            if self.world.is_main:
                out[name] = torch.from_numpy(whole)
        return out

    def serving_weights(self, dtype: torch.dtype) -> dict[str, torch.Tensor]:
        return {name: tensor.to(dtype) for name, tensor in self.hf_weights().items()}

    def copy_weights_from(self, other: "JaxPolicy") -> None:
        self.params = {name: self.jax.numpy.copy(value) for name, value in other.params.items()}

    def load_weights(self, path) -> None:
        """A saved step's weights: its orbax state when it holds this backend's, else its HF export."""
        from dockyard.models import checkpoint_weights_folder

        folder = checkpoint_weights_folder(path)
        held = step_contents(folder)
        if held["format"] == FORMAT and held["dcp"] and (folder / "orbax" / "params").is_dir():
            JaxState(self).load(folder, {"dcp": True, "optimizer": False})
        elif (folder / "hf" / "model.safetensors").is_file():
            self.params = self._placed(self.weights.from_hf(self.hf_tensors(folder / "hf"), str(folder / "hf")))
        else:
            raise CheckpointLoadError(f"{folder} holds neither an orbax checkpoint of the jax backend nor an HF "
                                      "export (checkpointing.export_hf) it can load")

    def checkpoint_state(self) -> "JaxState":
        return JaxState(self)

    def score_data(self, packed: bool) -> None:
        if packed:
            raise PolicySetupError("sft.packing: packed rows are not built for the jax backend; set sft.packing=false")
        self.temperature = 1.0


# --- jitted steps (module level: one compiled program per static setting and shape) -------------------


def _token_logprobs(weights, dtype, temperature, params, batch, with_entropy: bool):
    import jax
    import jax.numpy as jnp

    model = weights.model(params)
    hidden = model.hidden_states(batch["ids"], batch["positions"], batch["allowed"], dtype)
    picked = jnp.take_along_axis(hidden, batch["where"][..., None], axis=1)      # [rows, R, hidden]
    logits = model.logits(picked) / temperature
    logp = jax.nn.log_softmax(logits, axis=-1)
    chosen = jnp.take_along_axis(logp, batch["targets"][..., None], axis=-1)[..., 0] * batch["present"]
    entropy = -(jnp.exp(logp) * logp).sum(-1) * batch["present"] if with_entropy else None
    return chosen, entropy


def _jit(static: tuple[int, ...]):
    import jax

    return partial(jax.jit, static_argnums=static)


@_jit((0, 1, 2))
def _logprobs_step(weights, dtype, temperature, params, batch):
    return _token_logprobs(weights, dtype, temperature, params, batch, with_entropy=False)[0]


@_jit((0, 1, 2, 3))
def _grad_step(weights, dtype, temperature, settings, params, batch, totals):
    import jax

    from dockyard.policy.jax.losses import aggregate, per_token_loss

    def loss(params):
        logprobs, entropy = _token_logprobs(weights, dtype, temperature, params, batch, with_entropy=True)
        old = batch["old"] if "old" in batch else jax.lax.stop_gradient(logprobs)
        per_token, metrics = per_token_loss(settings, logprobs, old, batch["advantages"], batch["mask"],
                                            batch.get("ref"), entropy)
        per_token = per_token * batch["is_weights"]
        sums = {name: (value * batch["mask"]).sum() for name, value in metrics.items()}
        return aggregate(per_token, batch["mask"], settings.loss_agg_mode, totals[0], totals[1]), sums

    return jax.value_and_grad(loss, has_aux=True)(params)


@_jit(())
def _add(a, b):
    import jax

    return jax.tree.map(lambda x, y: x + y, a, b)


@_jit((0,))
def _apply_step(optimizer, params, opt_state, grads, lr, max_norm):
    """Clip by the global norm as torch's clip_grad_norm_ does, then the optimizer's update at `lr`."""
    import jax
    import jax.numpy as jnp
    import optax

    opt_state = opt_state._replace(hyperparams={**opt_state.hyperparams, "learning_rate": lr})
    norm = optax.global_norm(grads)
    scale = jnp.minimum(1.0, max_norm / (norm + 1e-6))
    grads = jax.tree.map(lambda g: g * scale, grads)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, norm


class JaxState:
    """A JAX policy's weights and optimizer state as an orbax checkpoint under orbax/, and its
    learning-rate position. Loads into any mesh: orbax reads each array into this run's sharding."""

    format = FORMAT
    adapters_only = False

    def __init__(self, policy: JaxPolicy):
        self.policy = policy

    def _trees(self, with_optimizer: bool) -> dict[str, Any]:
        """What is saved, one orbax item per folder under orbax/: the weights alone load as a reference."""
        trees = {"params": self.policy.params}
        if with_optimizer and self.policy.opt_state is not None:
            leaves = self.policy.jax.tree.leaves(self.policy.opt_state)
            trees["optimizer"] = {f"{index:05d}": leaf for index, leaf in enumerate(leaves)}
        return trees

    def save(self, folder: Path, with_optimizer: bool) -> None:
        import orbax.checkpoint as ocp

        checkpointer = ocp.StandardCheckpointer()
        try:
            for name, tree in self._trees(with_optimizer).items():
                checkpointer.save((folder / "orbax" / name).absolute(), tree)
            checkpointer.wait_until_finished()
        finally:
            checkpointer.close()
        mesh = self.policy.config.policy.jax_cfg.mesh
        (folder / LAYOUT).write_text(json.dumps({"data": mesh.data, "model": mesh.model}))

    def load(self, folder: Path, held: dict[str, Any]) -> None:
        import orbax.checkpoint as ocp

        policy, jax = self.policy, self.policy.jax
        if not held["dcp"]:
            policy.params = policy._placed(policy.weights.from_hf(policy.hf_tensors(folder / "hf"), str(folder / "hf")))
            return
        with_optimizer = held["optimizer"] and policy.opt_state is not None
        restored = {}
        checkpointer = ocp.StandardCheckpointer()
        try:
            for name, tree in self._trees(with_optimizer).items():
                # each array read into this run's sharding, whatever mesh wrote it
                target = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding), tree)
                path = folder / "orbax" / name
                try:
                    restored[name] = checkpointer.restore(path.absolute(), target)
                except Exception as err:   # orbax's and tensorstore's many kinds; the folder and last line name it
                    lines = [line.strip() for line in str(err).strip().splitlines() if line.strip()]
                    raise CheckpointLoadError(f"{path} cannot be loaded into this model: "
                                              f"{lines[-1][:600] if lines else type(err).__name__}") from None
        finally:
            checkpointer.close()
        policy.params = restored["params"]
        if with_optimizer:
            leaves = [restored["optimizer"][key] for key in sorted(restored["optimizer"])]
            policy.opt_state = jax.tree.unflatten(jax.tree.structure(policy.opt_state), leaves)

    def hf_weights(self) -> dict[str, torch.Tensor]:
        return self.policy.hf_weights()

    def scheduler_state(self) -> dict[str, Any]:
        return {"optimizer_steps": self.policy.optimizer_steps}

    def load_scheduler_state(self, state: dict[str, Any]) -> None:
        self.policy.optimizer_steps = int(state["optimizer_steps"])
