"""The JAX policy's weights as one flat pytree {HF name: array}: what optax updates, orbax saves,
the mesh shards and the generation servers receive. `Weights` binds that pytree to the NNX model
(its graph and state layout) and says how each weight is split over the mesh's `model` axis."""

from __future__ import annotations

from pathlib import Path

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from dockyard.policy.decoder_shape import DecoderShape
from dockyard.policy.jax.model import CausalLM
from dockyard.policy.samples import PolicySetupError

# Megatron's split: column-parallel projections split their output rows, row-parallel ones their input
# columns (one all-reduce after each pair), the embedding and LM head the vocabulary
_COLUMN = ("q_proj.weight", "k_proj.weight", "v_proj.weight", "q_proj.bias", "k_proj.bias", "v_proj.bias",
           "gate_proj.weight", "up_proj.weight", "embed_tokens.weight", "lm_head.weight")
_ROW = ("o_proj.weight", "down_proj.weight")


def _name(path) -> str:
    """A state leaf's HF name: its module path (dict keys, list indices), without the Variable's own `value`."""
    return ".".join(str(key.key if isinstance(key, jax.tree_util.DictKey) else key.idx) for key in path
                    if isinstance(key, (jax.tree_util.DictKey, jax.tree_util.SequenceKey)))


class Weights:
    """An NNX CausalLM's structure, and its weights as a flat {HF name: array} dict."""

    def __init__(self, shape: DecoderShape, remat: bool):
        self.shape, self.remat = shape, remat
        model = CausalLM(shape, remat)
        self.graphdef, state = nnx.split(model)
        leaves_with_paths, self.treedef = jax.tree_util.tree_flatten_with_path(state)
        self.names = [_name(path) for path, _ in leaves_with_paths]
        self.shapes = {name: leaf.shape for name, (_, leaf) in zip(self.names, leaves_with_paths)}

    # a static argument of the jitted steps: equal structures (a policy and its reference) share programs
    def __hash__(self) -> int:
        return hash((self.shape, self.remat))

    def __eq__(self, other) -> bool:
        return isinstance(other, Weights) and (self.shape, self.remat) == (other.shape, other.remat)

    def model(self, params: dict[str, jax.Array]) -> CausalLM:
        """The NNX model holding `params` (inside jit: traced arrays)."""
        return nnx.merge(self.graphdef, jax.tree_util.tree_unflatten(self.treedef, [params[n] for n in self.names]))

    def from_hf(self, hf: dict[str, np.ndarray], folder: str) -> dict[str, np.ndarray]:
        """This model's weights from an HF state dict (float32); a missing or misshapen weight is named."""
        params = {}
        for name in self.names:
            if name not in hf:
                raise PolicySetupError(f"{folder}: weight {name} is missing for a {self.shape.family} model")
            if tuple(hf[name].shape) != tuple(self.shapes[name]):
                raise PolicySetupError(f"{folder}: weight {name} has shape {tuple(hf[name].shape)}, the "
                                       f"{self.shape.family} config says {tuple(self.shapes[name])}")
            params[name] = np.asarray(hf[name], dtype=np.float32)
        return params

    def spec(self, name: str) -> PartitionSpec:
        if name.endswith(_COLUMN):
            return PartitionSpec("model", *([None] * (len(self.shapes[name]) - 1)))
        if name.endswith(_ROW):
            return PartitionSpec(None, "model")
        return PartitionSpec()

    def shardings(self, mesh: Mesh) -> dict[str, NamedSharding]:
        return {name: NamedSharding(mesh, self.spec(name)) for name in self.names}


def hf_tensors(folder: Path) -> dict[str, np.ndarray]:
    """An HF folder's safetensors weights as float32 numpy arrays (bf16 files included)."""
    from dockyard.model_files import folder_weights

    weights = folder_weights(folder)
    if not weights:
        raise PolicySetupError(f"policy.model_name: {folder} holds no .safetensors weights for the jax backend")
    return {name: tensor.float().numpy() for name, tensor in weights.items()}
