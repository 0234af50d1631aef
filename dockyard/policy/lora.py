"""LoRA for the dtensor backend (`policy.lora`): peft's LoRA layers injected into the transformers model
in place, only their weights trained. What leaves the trainer is the merged model, W + scale * B @ A
under the base model's own names: refits, HF exports. Checkpoints hold the adapters and their
optimizer state only, and the reference policy is the same model with its adapters switched off."""

from __future__ import annotations

import contextlib

import torch

from dockyard.config.schema.policy import LoraConfig
from dockyard.errors import DockyardError

_BASE = ".base_layer."


class LoraSetupError(DockyardError, ValueError):
    """The adapters cannot be placed as configured (named before anything trains)."""


def add_adapters(model: torch.nn.Module, config: LoraConfig, name: str) -> None:
    """Inject LoRA layers into `model` and leave only them trainable."""
    from peft import LoraConfig as PeftLoraConfig, inject_adapter_in_model

    modules = {leaf.rsplit(".", 1)[-1] for leaf, _ in model.named_modules()}
    missing = sorted(set(config.target_modules) - modules)
    if missing:
        raise LoraSetupError(f"policy.lora.target_modules: {name} has no module named {', '.join(missing)} "
                             f"(its linear layers: {', '.join(sorted(_linear_names(model)))})")
    inject_adapter_in_model(PeftLoraConfig(r=config.rank, lora_alpha=config.alpha, lora_dropout=config.dropout,
                                           target_modules=list(config.target_modules)), model)
    for parameter_name, parameter in model.named_parameters():
        parameter.requires_grad_("lora_" in parameter_name)


def _linear_names(model: torch.nn.Module) -> set[str]:
    return {name.rsplit(".", 1)[-1] for name, module in model.named_modules() if isinstance(module, torch.nn.Linear)}


def _adapted_layers(model: torch.nn.Module) -> dict[str, float]:
    """Name of every LoRA-adapted module -> its scale (alpha / rank)."""
    from peft.tuners.lora import LoraLayer

    return {name: float(module.scaling["default"]) for name, module in model.named_modules()
            if isinstance(module, LoraLayer)}


def has_adapters(model: torch.nn.Module) -> bool:
    return bool(_adapted_layers(model))


def merged_weights(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A full state dict of the adapted `model` as the base model's state dict with the adapters merged
    in (what a generation server or an HF folder holds). Unadapted models pass through unchanged."""
    layers = _adapted_layers(model)
    if not layers:
        return state
    merged: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        if ".lora_A." in name or ".lora_B." in name:
            continue
        if _BASE in name:
            module, leaf = name.split(_BASE)
            if leaf == "weight":
                down, up = state[f"{module}.lora_A.default.weight"], state[f"{module}.lora_B.default.weight"]
                tensor = tensor + layers[module] * (up.to(torch.float32) @ down.to(torch.float32)).to(tensor.dtype)
            name = f"{module}.{leaf}"
        merged[name] = tensor
    return merged


@contextlib.contextmanager
def adapters_off(model: torch.nn.Module):
    from peft.tuners.tuners_utils import BaseTunerLayer

    layers = [module for module in model.modules() if isinstance(module, BaseTunerLayer)]
    for layer in layers:
        layer.enable_adapters(False)
    try:
        yield
    finally:
        for layer in layers:
            layer.enable_adapters(True)


class BaseModelReference:
    """The reference policy of a LoRA run that starts from the policy's own model: the trainer's model
    with its adapters switched off (no second copy of the weights)."""

    def __init__(self, policy):
        self.policy = policy

    @torch.no_grad()
    def logprobs(self, samples):
        with adapters_off(self.policy.model):
            return self.policy.logprobs(samples)
