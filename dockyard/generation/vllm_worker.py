"""dockyard's worker extension for vLLM (`--worker-extension-cls`): methods mixed into every vLLM
worker and called through the dev-mode `/collective_rpc` route.

- `dockyard_load_weights(path)`: reload the weights from a safetensors folder (the shared-memory /
  disk refit), then refresh the LM head.
- `dockyard_join_weight_group(...)` / `dockyard_receive_weights(meta)`: the broadcast refit over a
  torch.distributed group of its own (gloo on CPU, NCCL on GPU) with trainer rank 0 as rank 0.
- `dockyard_environment(names)`: the worker's view of environment variables (vllm_cfg.env_vars).

Why the LM head refresh: on CPU vLLM prepacks the LM head into a oneDNN handle after loading; a
tied model's checkpoint has no `lm_head.weight`, so a reload updates the embedding and leaves the
packed head stale (logits from the old weights). Re-running the head's post-load step rebuilds it.

Imported inside vLLM's worker processes only; nothing here is imported by the trainer.
"""

from __future__ import annotations

import json
import os

import torch

from dockyard.distributed import DTYPE_NAMES, weight_sync_group


class DockyardWorkerExtension:
    _dockyard_groups: dict | None = None

    def _dockyard_model(self):
        return self.model_runner.get_model()

    def _dockyard_refresh_lm_head(self) -> bool:
        model = self._dockyard_model()
        head = getattr(model, "lm_head", None)
        method = getattr(head, "quant_method", None)
        if head is None or method is None or not hasattr(method, "process_weights_after_loading"):
            return False
        method.process_weights_after_loading(head)
        return True

    def dockyard_load_weights(self, path: str) -> dict:
        self.reload_weights(weights_path=path)
        return {"lm_head_refreshed": self._dockyard_refresh_lm_head()}

    def dockyard_join_weight_group(self, master_address: str, master_port: str, rank: str, world_size: str,
                                   group_name: str, backend: str = "gloo", timeout_s: str = "300") -> dict:
        if self._dockyard_groups is None:
            self._dockyard_groups = {}
        self._dockyard_groups[group_name] = weight_sync_group(
            master_address, int(master_port), int(rank), int(world_size), group_name, backend, float(timeout_s))
        return {"joined": group_name, "rank": int(rank)}

    def dockyard_receive_weights(self, meta: str) -> dict:
        """`meta`: JSON {group_name, names, dtypes, shapes}; the trainer broadcasts the tensors in that order."""
        spec = json.loads(meta)
        group = (self._dockyard_groups or {}).get(spec["group_name"])
        if group is None:
            raise RuntimeError(f"no weight group {spec['group_name']!r}; call dockyard_join_weight_group first")
        device = "cpu" if getattr(self, "device", None) is None else self.device
        received = []
        for name, dtype, shape in zip(spec["names"], spec["dtypes"], spec["shapes"]):
            tensor = torch.empty(shape, dtype=DTYPE_NAMES[dtype], device=device)
            group.broadcast(tensor, 0).wait()
            received.append((name, tensor))
        self.reload_weights(weights_iterator=iter(received))
        return {"tensors": len(received), "lm_head_refreshed": self._dockyard_refresh_lm_head()}

    def dockyard_environment(self, names: str) -> dict:
        return {name: os.environ.get(name) for name in json.loads(names)}
