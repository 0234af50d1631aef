"""Supervised fine-tuning (a config with an `sft` section): stage 1 of the V4-style recipe.

One step, phase by phase:

    draw train_global_batch_size conversations -> tokenize (loss on assistant tokens only)
    -> train (next-token NLL, one optimizer step) -> [validate] -> [checkpoint]

Validation: the loss on data.validation's conversations and, when that dataset has labels
(label_key), generation-based accuracy: the conversation up to its last assistant reply is the
prompt, the run's generation server answers greedily and the environment scores it, as GRPO
validates. The run reads `sft`, `policy`, `data`, `env` (scoring that validation), `checkpointing`,
`logger`, `cluster`, and of `grpo` only val_at_start and max_val_samples.

Everything else is what every loop shares (trainer.py): trainer ranks, the policy backend,
checkpoints with the data position, exact resume, and stops at a safe point before requeue.
"""

from __future__ import annotations

import dataclasses
import time

import torch
import torch.distributed as dist

from dockyard.algorithms.losses import LossInputs
from dockyard.data.conversations import conversation_tokens, trailing_assistant_removed
from dockyard.data.datasets import Prompt, build_messages
from dockyard.loop.trainer import Trainer
from dockyard.loop.rollouts import split_counts
from dockyard.policy.samples import Sample


class NextTokenLoss:
    """Negative log-likelihood of each trained token (the policy's loss interface)."""

    kind = "nll"   # what a backend in another framework rebuilds (policy/jax/losses.py)

    def __call__(self, inputs: LossInputs):
        return -inputs.logprobs, {}


class SFTTrainer(Trainer):
    def __init__(self, cfg, world, device, replicas, weight_sync_port):
        super().__init__(cfg, world, device, replicas, weight_sync_port)
        self.policy.score_data(packed=cfg.sft.packing)   # the data's likelihood, not a tempered sampler's
        self.loss = NextTokenLoss()
        self.epochs_done = 0
        self.conversations: list[Prompt] = []
        if world.is_main:
            self.conversations = list(self.validation)
            labelled = cfg.data.validation is not None and cfg.data.validation.label_key is not None
            # generation-based validation asks the conversation up to its last reply
            self.validation = [dataclasses.replace(p, input=trailing_assistant_removed(p.input))
                               for p in self.validation] if labelled else []
            self.shares = split_counts(self.mini_batch, [d.weight for d in cfg.data.datasets],
                                       [None] * len(cfg.data.datasets))

    def schedule(self) -> tuple[int, int]:
        return self.cfg.sft.max_num_steps, self.cfg.sft.val_period

    def total_optimizer_steps(self) -> int:
        return self.cfg.sft.max_num_steps

    def finished(self, step: int) -> bool:
        return self.epochs_done >= self.cfg.sft.max_num_epochs

    def longest_prompt(self) -> int | None:
        return None   # conversations longer than policy.max_total_sequence_length are cut, not skipped

    # --- data ---------------------------------------------------------------------------------

    def _tokens(self, prompt: Prompt) -> tuple[Sample, bool]:
        """The conversation as a training sample (the first token is never predicted) and whether it
        was cut to policy.max_total_sequence_length."""
        messages = build_messages(prompt, self.cfg.data.add_system_prompt)
        chat = self.cfg.policy.generation.chat_template
        ids, mask = conversation_tokens(self.tokenizer, messages, self.chat_template, chat.generation_prompt_kwargs,
                                        self.cfg.sft.loss_on_prompt, where=f"dataset {prompt.source!r}")
        limit = self.cfg.policy.max_total_sequence_length
        return Sample(token_ids=ids[:limit], prompt_length=1, loss_mask=mask[1:limit]), len(ids) > limit

    def _batch(self):
        """Rank 0: the step's conversations as samples, the epochs completed, data metrics."""
        prompts = [p for loader, n in zip(self.loaders, self.shares) for p in loader.take(n)]
        with self.timer("tokenize"):
            pairs = [self._tokens(p) for p in prompts]
        samples = [sample for sample, _ in pairs]
        trained = sum(sum(s.loss_mask) for s in samples)
        metrics = {"data/tokens": float(sum(len(s.token_ids) for s in samples)), "data/trained_tokens": float(trained),
                   "data/truncated": float(sum(cut for _, cut in pairs)),
                   "data/epoch": float(min(loader.completed_epochs for loader in self.loaders))}
        return samples, int(metrics["data/epoch"]), metrics

    # --- the step -----------------------------------------------------------------------------

    def train_step(self, step: int) -> dict[str, float]:
        self.timer.seconds = {}
        started = time.perf_counter()
        payload = self._batch() if self.world.is_main else None
        samples, self.epochs_done, metrics = self._broadcast(payload)
        self.safe_point()
        local = samples[self.world.data_rank::self.world.data_size]
        with self.timer("train"):
            result = self.train_mini_batch(local, None, None, self.loss, interrupt=self.train_interrupt())
        self.engine_is_current = False
        metrics.update({f"train/{k}": v for k, v in result.items()})
        metrics["train/tokens_per_s"] = metrics["data/tokens"] / (time.perf_counter() - started)
        return metrics | {f"time/{name}": seconds for name, seconds in self.timer.seconds.items()}

    # --- validation ---------------------------------------------------------------------------

    def validate(self, step: int) -> dict[str, float]:
        metrics = self._validation_loss()
        if self._broadcast(bool(self.validation) if self.world.is_main else None):
            metrics.update(super().validate(step))
        return metrics

    def _validation_loss(self) -> dict[str, float]:
        """Token-mean NLL of the validation conversations' trained tokens (every rank takes a share)."""
        samples = self._broadcast([self._tokens(p)[0] for p in self.conversations] if self.world.is_main else None)
        if not samples:
            return {}
        local = samples[self.world.data_rank::self.world.data_size]
        sums = torch.zeros(2, dtype=torch.float64)
        for sample, logprobs in zip(local, self.policy.logprobs(local)):   # a collective, even with no rows
            mask = sample.response_mask()
            sums += torch.tensor([float(-(logprobs * mask).sum()), float(mask.sum())], dtype=torch.float64)
        if self.world.world_size > 1:
            dist.all_reduce(sums)
        return {"val/loss": float(sums[0] / max(float(sums[1]), 1.0))}
