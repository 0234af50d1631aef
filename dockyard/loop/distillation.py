"""On-policy distillation (grpo.adv_estimator.name: opd), stage 3 of the V4-style recipe.

The async GRPO loop (async_grpo.py) with the environment's reward replaced by teachers: the student
samples, each rollout goes to the teacher its agent name selects (teachers.py), and a step is

    take B groups -> filter (status) -> teachers score the sampled tokens (prefill)
    -> student prev_logprobs -> advantage per token: pg_ratio x sg[log p_teacher - log p_student]
    -> train -> publish weights

The environment still scores every rollout; its reward is logged (reward/*) but does not train.
Token-level estimator only: the teachers return the logprob of each sampled token, not their
distribution over the vocabulary, so full-vocabulary KL (and the GKD branch) are refused by name.
"""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist

from dockyard.algorithms.advantages import OnPolicyDistillationAdvantage
from dockyard.config.errors import ConfigError
from dockyard.loop.async_grpo import AsyncGRPOTrainer
from dockyard.data.teacher_routing import TeacherRouting
from dockyard.loop.teachers import TeacherScorer
from dockyard.policy.samples import Sample


class OnPolicyDistillationTrainer(AsyncGRPOTrainer):
    needs_old_logprobs = True   # the advantage subtracts the student's prev_logprobs

    def __init__(self, cfg, world, device, replicas, weight_sync_port):
        super().__init__(cfg, world, device, replicas, weight_sync_port)
        opd = cfg.on_policy_distillation
        adv = cfg.grpo.adv_estimator
        self.estimator = OnPolicyDistillationAdvantage(adv.norm_mode, adv.epsilon, pg_ratio=opd.pg_ratio)
        self.scorer: TeacherScorer | None = None
        if world.is_main:
            routing = TeacherRouting(cfg)
            # every training row is routed once now: an unknown agent name fails before anything runs
            counts = routing.check([p for loader in self.loaders for p in loader.prompts])
            print("dockyard: opd: training prompts per teacher: " +
                  ", ".join(f"{name} {count}" for name, count in counts.items()), file=sys.stderr, flush=True)
            self.scorer = TeacherScorer(self._teacher_clients(json.loads(os.environ.get("DOCKYARD_TEACHERS", "{}"))),
                                        routing)

    def _teacher_clients(self, teachers: dict[str, list[dict]]) -> dict:
        """One Generator per teacher (a fleet over its replicas) from {teacher: [{name, url, log}]}."""
        from dockyard import registry
        from dockyard.generation.fleet import GeneratorFleet

        if not teachers:
            raise ConfigError("on_policy_distillation: no teacher server was given to the trainer "
                              "(DOCKYARD_TEACHERS is empty)")
        server = registry.build("generation_backend", self.cfg.policy.generation.backend, config=self.cfg)
        timeout = self.cfg.grpo.sampler.rollout_timeout_s
        clients = {}
        for name, replicas in teachers.items():
            generators = [server.client(r["url"], r["name"], r.get("log"), request_timeout_s=timeout)
                          for r in replicas]
            clients[name] = generators[0] if len(generators) == 1 else GeneratorFleet(generators, f"teacher {name}")
        return clients

    def server_clients(self) -> list:
        teachers = [getattr(client, "replicas", [client]) for client in self.scorer.teachers.values()]
        return super().server_clients() + [replica for replicas in teachers for replica in replicas]

    # --- the step -----------------------------------------------------------------------------

    def payload(self, kept: list, metrics: dict):
        """Rank 0: the teachers' logprobs of every kept rollout ride along with it."""
        samples, rewards, metrics = super().payload(kept, metrics)
        prompts = [group.prompt for group in kept for _ in group.trajectories]
        with self.timer("teacher"):
            scores, figures = self.scorer.score(samples, prompts)
        for sample, logprobs in zip(samples, scores):
            sample.teacher_logprobs = logprobs
        metrics.update(figures)
        return samples, rewards, metrics

    def set_advantages(self, samples: list[Sample], rewards: list[float], local: list[Sample],
                       local_positions: list[int], old: list[torch.Tensor] | None,
                       ref: list[torch.Tensor] | None) -> dict[str, float]:
        masks = [s.response_mask() for s in local]
        teacher = [torch.tensor(s.teacher_logprobs, dtype=torch.float32) for s in local]
        advantages = self.estimator(old, teacher, masks)
        for sample, values in zip(local, advantages):
            sample.token_advantages = values.tolist()
        # k1 estimate of KL(student || teacher) per trained token, over every rank's samples
        sums = torch.tensor([float(sum(((o - t) * m).sum() for o, t, m in zip(old, teacher, masks))),
                             float(sum(m.sum() for m in masks))], dtype=torch.float64)
        if self.world.world_size > 1:
            dist.all_reduce(sums)
        return {"opd/reverse_kl_k1": float(sums[0] / max(float(sums[1]), 1.0)),
                "opd/advantage_mean": -self.estimator.pg_ratio * float(sums[0] / max(float(sums[1]), 1.0))}

    # --- run ----------------------------------------------------------------------------------

    def run(self) -> None:
        try:
            super().run()
        finally:
            if self.scorer is not None:
                self.scorer.close()
