"""What the JAX backend does not build, by name: the preflight and the backend both ask here, so a
setting it would not read is refused before anything starts instead of being ignored."""

from __future__ import annotations

from dockyard.config import topology
from dockyard.config.errors import Problem
from dockyard.config.fields import changed_fields
from dockyard.config.schema import MasterConfig

# what policy/jax/losses.py implements (named here so the preflight need not import JAX)
LOSSES = ("clipped_pg", "gspo")
KL_ESTIMATORS = ("k1", "k2", "k3")


def unbuilt(cfg: MasterConfig, planned_world: bool = True) -> list[Problem]:
    """`planned_world`: also the trainer world the config plans (the preflight); the backend checks the
    world it was started in instead."""
    policy = cfg.policy
    if policy.backend != "jax":
        if changed_fields(policy.jax_cfg):
            return [Problem("policy.jax_cfg", f"a setting of the jax backend, and policy.backend is "
                            f"{policy.backend}; remove it")]
        return []
    problems = []
    world, mesh = topology.trainer_world_size(cfg), policy.jax_cfg.mesh
    devices = mesh.data * mesh.model
    if planned_world and world > 0 and cfg.cluster.gpus_per_node > 0 and devices != world:
        problems.append(Problem("policy.jax_cfg.mesh", f"data x model = {devices} devices, and the trainer has "
                                f"{world} GPUs (one process each): make them equal"))
    elif planned_world and world > 0 and devices % world:
        problems.append(Problem("policy.jax_cfg.mesh", f"data x model = {devices} devices do not divide over the "
                                f"{world} trainer processes (each makes its share as CPU host devices)"))
    if policy.precision == "fp16":
        problems.append(Problem("policy.precision", "fp16 needs loss scaling, which the jax backend does not do; "
                                "use bf16 or fp32"))
    if policy.lora.enabled:
        problems.append(Problem("policy.lora.enabled", "LoRA is not built for the jax backend; use dtensor"))
    if policy.dynamic_batching.enabled and policy.dynamic_batching.share_prompts:
        problems.append(Problem("policy.dynamic_batching.share_prompts", "shared-prompt rows are not built for the "
                                "jax backend; turn it off"))
    if policy.megatron_cfg is not None:
        problems.append(Problem("policy.megatron_cfg", "a megatron setting, which the jax backend does not read; "
                                "remove it"))
    counterparts = {"activation_checkpointing": "policy.jax_cfg.remat",
                    "tensor_parallel_size": "policy.jax_cfg.mesh.model"}
    for name in changed_fields(policy.dtensor_cfg):
        counterpart = counterparts.get(name)
        problems.append(Problem(f"policy.dtensor_cfg.{name}", "a dtensor setting, which the jax backend does not read"
                                + (f"; set {counterpart} instead" if counterpart else "; remove it")))
    if cfg.loss_fn.name not in LOSSES:
        problems.append(Problem("loss_fn.name", f"{cfg.loss_fn.name!r} has no JAX implementation; the jax backend "
                                f"trains with {', '.join(LOSSES)}"))
    if cfg.loss_fn.reference_policy_kl_type not in KL_ESTIMATORS:
        problems.append(Problem("loss_fn.reference_policy_kl_type", "no JAX implementation; the jax backend knows "
                                + ", ".join(KL_ESTIMATORS)))
    return problems
