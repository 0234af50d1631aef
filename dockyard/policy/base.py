"""The Policy interface: what a loop may ask of a trainer backend (dtensor, megatron, JAX), and
nothing else. Every method is a collective: each trainer rank calls it, in the same order.

At the boundary: token ids (`Sample`), per-token figures as CPU tensors, weights as HF-named
tensors. A loop never sees a backend's model, optimizer or sharding; the loss it passes is a loss
component (dockyard/algorithms/losses.py) whose config a backend in another framework rebuilds in
its own (`loss.config`)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import Callable

import torch

from dockyard.io.checkpoint import CheckpointState
from dockyard.policy.samples import Sample


class Policy(ABC):
    """A trainer backend's policy (and, built with trainable=False, a reference or teacher model)."""

    @abstractmethod
    def logprobs(self, samples: list[Sample]) -> list[torch.Tensor]:
        """Per sample, the logprob of each response token under the current weights (CPU, float32)."""

    @abstractmethod
    def train_mini_batch(self, samples: list[Sample], old_logprobs: list[torch.Tensor] | None,
                         ref_logprobs: list[torch.Tensor] | None, loss_fn,
                         interrupt: Callable[[], bool] | None = None,
                         before_loss: Callable[[list[Sample], list[torch.Tensor]], None] | None = None
                         ) -> dict[str, float]:
        """One optimizer step on this rank's share of a mini-batch; its figures (loss, grad_norm, lr,
        the loss's own metrics per trained token). `interrupt` may end it before the step
        (TrainingInterrupted, nothing changed); `before_loss` sees each micro-batch's old logprobs."""

    @abstractmethod
    def serving_weights(self, dtype: torch.dtype) -> dict[str, torch.Tensor]:
        """Full weights in `dtype` under the HF model's names, tied aliases left out, on rank 0 ({} on
        the others): what a generation server loads."""

    @abstractmethod
    def copy_weights_from(self, other: "Policy") -> None:
        """Take `other`'s current weights (same backend and layout): a moving reference model."""

    @abstractmethod
    def load_weights(self, path: str | Path) -> None:
        """Only the model weights of a saved dockyard step (a reference policy from a checkpoint)."""

    @abstractmethod
    def checkpoint_state(self) -> CheckpointState:
        """What CheckpointManager saves and restores of this policy (weights, optimizer, scheduler)."""

    @abstractmethod
    def score_data(self, packed: bool) -> None:
        """From now on logprobs are the data's likelihood (temperature 1: SFT); `packed`: rows of
        several conversations sharing their first token (sft.packing), refused by name where the
        backend cannot build them."""

    def base_model_reference(self) -> "Policy | None":
        """The model without its LoRA adapters, as a reference policy; None where not supported."""
        return None
