"""The sync GRPO loop, run by every trainer rank; rank 0 drives generation and scoring.

One step, phase by phase (each timed):

    refit -> generate -> reward -> [safe point] -> logprobs -> advantages -> train

then the runner's validate / checkpoint / log (trainer.py, which holds what every loop shares).
Token in, token out: the trainer trains on the exact token ids the engine sampled.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from dockyard import registry
from dockyard.algorithms.reward_transforms import sequence_kl
from dockyard.config.schema import MasterConfig
from dockyard.distributed import WorldInfo
from dockyard.errors import DockyardError
from dockyard.generation.generator import GenerationServerError
from dockyard.io.checkpoint import CheckpointLoadError
from dockyard.loop.off_policy_safeguards import apply_safeguards, enabled_safeguards
from dockyard.loop.trainer import Trainer
from dockyard.models import ModelNotFoundError
from dockyard.policy.samples import Sample


def mini_batch_bounds(count: int, parts: int) -> list[tuple[int, int]]:
    """[start, end) of each mini-batch when `count` rollouts make `parts` optimizer steps: equal sizes
    (the configured train_global_batch_size when nothing was filtered), empty ones left out."""
    bounds = [(count * j // parts, count * (j + 1) // parts) for j in range(parts)]
    return [(a, b) for a, b in bounds if b > a]


class ReferenceModelError(DockyardError, ValueError):
    """The configured reference policy cannot be loaded (never replaced by another one)."""


class GRPOTrainer(Trainer):
    # a loop whose advantages need the trainer's logprobs of the sampled tokens before training (OPD)
    needs_old_logprobs = False

    def __init__(self, cfg: MasterConfig, world: WorldInfo, device: torch.device, replicas: list[dict],
                 weight_sync_port: int):
        super().__init__(cfg, world, device, replicas, weight_sync_port)
        self.reference = None
        if cfg.loss_fn.reference_policy_kl_penalty > 0 and lora_base_is_reference(cfg):
            self.reference = self.policy.base_model_reference()
        elif cfg.loss_fn.reference_policy_kl_penalty > 0:
            source = cfg.loss_fn.reference_model
            # the structure comes from hf_path (else the policy's folder); a checkpoint's weights replace its own
            self.reference = registry.build("policy_backend", cfg.policy.backend, config=cfg, world=world,
                                            device=device, total_optimizer_steps=0,
                                            model_path=source.hf_path, trainable=False)
            if source.checkpoint_path:
                try:
                    self.reference.load_weights(source.checkpoint_path)
                except (CheckpointLoadError, ModelNotFoundError) as err:
                    raise ReferenceModelError(f"loss_fn.reference_model.checkpoint_path: {err}") from None
        adv = cfg.grpo.adv_estimator
        self.estimator = registry.build("advantage_estimator", adv.name, norm_mode=adv.norm_mode,
                                        epsilon=adv.epsilon, **(adv.model_extra or {}))
        self.loss_fn = registry.build("loss", cfg.loss_fn.name, config=cfg.loss_fn)

    def generate_and_score(self, step: int) -> tuple[list[Sample], list[float], dict[str, float]]:
        """The step's training groups (flat, groups consecutive), their rewards and the sampling metrics."""
        self.engine_seconds = 0.0
        served = list(self.fleet.groups_served)
        self.collector.step = step
        groups, metrics = self.collector.collect(self.cfg.policy.seed * 1_000_003 + step)
        if len(served) > 1:
            for index, (before, after) in enumerate(zip(served, self.fleet.groups_served)):
                metrics[f"gen/groups_replica{index}"] = float(after - before)
        trajectories = [t for g in groups for t in g.trajectories]
        metrics["gen/tokens_per_s"] = metrics["gen/generated_tokens"] / max(self.timer.seconds.get("generate", 0.0), 1e-9)
        metrics["gen/engine_seconds"] = self.engine_seconds
        metrics.update(self.fleet.take_request_seconds())
        return [t.sample for t in trajectories], [t.reward for t in trajectories], metrics

    def _generate_for_step(self, step: int):
        """Rank 0's rollouts; None when a stop was requested and the servers went away meanwhile."""
        if self.stopper.requested:
            return None   # a signal came since the last safe point: no new rollouts for a dropped step
        self.generating = True
        try:
            return self.generate_and_score(step)
        except GenerationServerError:
            if self.stopper.requested:
                return None
            raise
        finally:
            self.generating = False

    def train_step(self, step: int) -> dict[str, float]:
        self.timer.seconds = {}
        started = time.perf_counter()
        with self.timer("refit"):
            self.refit()
        payload = self._generate_for_step(step) if self.world.is_main else None
        payload = self._broadcast(payload)
        self.safe_point(batch_missing=payload is None)
        samples, rewards, metrics = payload
        metrics.update(self.learn(step, samples, rewards))
        self.engine_is_current = False
        phases = dict(self.timer.seconds)
        elapsed = time.perf_counter() - started
        metrics["train/tokens_per_s"] = sum(len(s.token_ids) for s in samples) / elapsed
        return metrics | {f"time/{name}": seconds for name, seconds in phases.items()}

    def learn(self, step: int, samples: list[Sample], rewards: list[float]) -> dict[str, float]:
        """Advantages, logprobs and the optimizer steps on the step's rollouts (every rank holds all
        of them; groups consecutive). Raises StepAbandoned when a stop comes before anything trained."""
        metrics: dict[str, float] = {}
        # Mini-batch j is the j-th slice of the step's rollouts; each data-parallel rank trains on every
        # data_size-th of it. Filters shrink the step; the same number of optimizer steps remains.
        positions = [list(range(a, b))[self.world.data_rank::self.world.data_size]
                     for a, b in mini_batch_bounds(len(samples), self.num_mini_batches)]
        mini_batches = [[samples[i] for i in chunk] for chunk in positions]
        local = [s for mb in mini_batches for s in mb]
        local_positions = [i for chunk in positions for i in chunk]
        metrics["train/kept_fraction"] = len(samples) / (self.cfg.grpo.num_prompts_per_step * self.group_size)
        # One optimizer step per rollout batch: the weights that sampled are the ones being trained,
        # so the training forward supplies the old logprobs and the separate pass is skipped. With
        # IS correction by clipping (weights only, no token dropped) that holds too: the weights
        # are computed from the forward's detached logprobs, micro-batch by micro-batch.
        loss_cfg = self.cfg.loss_fn
        safeguards = enabled_safeguards(loss_cfg)
        kl_in_reward = self.reference is not None and loss_cfg.kl_in_reward
        one_step = self.num_mini_batches == 1 and loss_cfg.ppo_epochs == 1 and not kl_in_reward \
            and not self.needs_old_logprobs
        in_forward = one_step and safeguards == ["is_correction"] and loss_cfg.is_correction.action == "clip" \
            and not loss_cfg.use_rollout_logprobs
        on_policy = one_step and (not safeguards or in_forward)
        with self.timer("logprobs"):
            if loss_cfg.use_rollout_logprobs:
                old = [torch.tensor(s.rollout_logprobs) for s in local]
            else:
                old = None if on_policy else self.policy.logprobs(local)
            ref = self.reference.logprobs(local) if self.reference is not None else None
        with self.timer("advantages"):
            metrics.update(self.set_advantages(samples, rewards, local, local_positions, old, ref))
        safeguard_figures: list[tuple[float, dict[str, float]]] = []
        def safeguards_in_forward(batch: list[Sample], batch_old: list[torch.Tensor]) -> None:
            tokens = float(sum(s.response_mask().sum() for s in batch))
            safeguard_figures.append((tokens, apply_safeguards(loss_cfg, batch, batch_old)))

        before_loss = safeguards_in_forward if in_forward else None
        if not in_forward and safeguards:
            metrics.update(apply_safeguards(loss_cfg, local, old))
        with self.timer("train"):
            train_metrics: dict[str, float] = {}
            for epoch in range(self.cfg.loss_fn.ppo_epochs):
                offset = 0
                for index, mb in enumerate(mini_batches):
                    span = slice(offset, offset + len(mb))
                    interrupt = self.train_interrupt() if epoch == 0 and index == 0 else None
                    result = self.train_mini_batch(mb, old[span] if old is not None else None,
                                                   ref[span] if ref else None, self.loss_fn,
                                                   interrupt=interrupt, before_loss=before_loss)
                    offset += len(mb)
                    for key, value in result.items():
                        train_metrics[key] = train_metrics.get(key, 0.0) + value / (
                            len(mini_batches) * self.cfg.loss_fn.ppo_epochs)
        interval = self.cfg.loss_fn.reference_model.update_interval
        if self.reference is not None and interval > 0 and step % interval == 0:
            self.reference.copy_weights_from(self.policy)
        metrics.update({f"train/{k}": v for k, v in train_metrics.items()})
        if safeguard_figures:   # token-weighted over the micro-batches
            total = sum(tokens for tokens, _ in safeguard_figures) or 1.0
            for name in safeguard_figures[0][1]:
                metrics[name] = sum(tokens * figures[name] for tokens, figures in safeguard_figures) / total
        return metrics

    def set_advantages(self, samples: list[Sample], rewards: list[float], local: list[Sample],
                       local_positions: list[int], old: list[torch.Tensor] | None,
                       ref: list[torch.Tensor] | None) -> dict[str, float]:
        """Set the advantage of this rank's samples (`local`, at `local_positions` in the step's
        `samples`) from every rollout's reward: group-relative, the reference KL in the reward first."""
        loss_cfg, metrics = self.cfg.loss_fn, {}
        reward_tensor = torch.tensor(rewards, dtype=torch.float64)
        if self.reference is not None and loss_cfg.kl_in_reward:
            penalty = self._gather_by_position(
                sequence_kl(old, ref, [s.response_mask() for s in local], loss_cfg.reference_policy_kl_type),
                local_positions, len(samples))
            reward_tensor = reward_tensor - loss_cfg.reference_policy_kl_penalty * penalty
            metrics["reward/kl_in_reward_mean"] = float(penalty.mean()) if len(samples) else 0.0
        advantages = self.estimator(reward_tensor, [self.group_size] * (len(rewards) // self.group_size))
        for sample, position in zip(local, local_positions):
            sample.advantage = float(advantages[position])
        return metrics

    def _gather_by_position(self, values: torch.Tensor, positions: list[int], count: int) -> torch.Tensor:
        """Every rank's per-sample values, placed at the samples' positions in the step's rollouts."""
        pieces = [(positions, values.tolist())]
        if self.world.world_size > 1:
            pieces = [None] * self.world.world_size
            dist.all_gather_object(pieces, (positions, values.tolist()))
        full = torch.zeros(count, dtype=torch.float64)
        for where, got in pieces:
            full[where] = torch.tensor(got, dtype=torch.float64)
        return full

    def finished(self, step: int) -> bool:
        """True when the run ends after `step` before max_steps: every training dataset has been drawn
        grpo.max_num_epochs times (rank 0 holds the loaders; every rank gets its answer)."""
        epochs = self._broadcast(min(loader.completed_epochs for loader in self.loaders) if self.world.is_main
                                 else None)
        done = epochs >= self.cfg.grpo.max_num_epochs
        if done and self.world.is_main:
            print(f"dockyard: the training data has been passed over {epochs} time(s) "
                  f"(grpo.max_num_epochs={self.cfg.grpo.max_num_epochs}); ending after step {step}",
                  file=sys.stderr, flush=True)
        return done


def lora_base_is_reference(cfg: MasterConfig) -> bool:
    """A LoRA run whose reference is the model it starts from takes it from its own weights, adapters off."""
    source = cfg.loss_fn.reference_model
    return cfg.policy.lora.enabled and not source.checkpoint_path and (
        source.hf_path is None or Path(source.hf_path).resolve() == Path(cfg.policy.model_name).resolve())
