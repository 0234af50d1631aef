"""One step's rollouts, on trainer rank 0: draw prompts, sample a group per prompt, score every
trajectory (retrying failed ones), apply the reward transforms and the group filters, and, with
dynamic sampling, refill until the step has its num_prompts_per_step groups.

A trajectory attempt FAILS when the environment raises while scoring it (a scorer crash; a sandbox
or tool error in tool environments). It is sampled again, up to grpo.retry_limit attempts in all;
after the last one it is FAILED with reward 0, and the status filter drops its group.
"""

from __future__ import annotations

import contextlib
import json
import math
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, ContextManager

import torch

from dockyard import registry
from dockyard.algorithms.group_filters import FAILED, enabled_filters
from dockyard.algorithms.reward_transforms import RolloutFacts, enabled_transforms
from dockyard.config.schema import MasterConfig
from dockyard.data.datasets import Prompt, PromptLoader
from dockyard.generation.engine import Completion, SamplingParams
from dockyard.policy.samples import Sample

OK = "ok"


@dataclass
class Trajectory:
    sample: Sample
    raw_reward: float           # the environment's score (0 when FAILED)
    reward: float = 0.0         # after the reward transforms: what trains
    status: str = OK
    attempts: int = 1
    action_valid: bool = True
    finish_reason: str = "stop"
    max_tokens: int = 0
    error: str | None = None
    versions: list[int] | None = None   # async: per response token, the weights version that sampled it (-1: not sampled)
    suspicious: list[str] = field(default_factory=list)   # what in an agent's workspace shadows test machinery
    verifier_error: str | None = None   # the grader could not trust the tests' verdict (the reward is 0)


@dataclass
class Group:
    prompt: Prompt
    trajectories: list[Trajectory] = field(default_factory=list)


def split_counts(total: int, weights: list[float], shares: list[int | None]) -> list[int]:
    """Prompts per dataset: explicit shares, else `total` proportional to weight (largest remainders)."""
    if all(s is not None for s in shares):
        return [int(s) for s in shares]
    raw = [total * w / sum(weights) for w in weights]
    counts = [int(r) for r in raw]
    for index in sorted(range(len(raw)), key=lambda i: raw[i] - counts[i], reverse=True)[:total - sum(counts)]:
        counts[index] += 1
    return counts


class RolloutCollector:
    """Rank 0's sampler. `generate(prompt_ids, params)` is the engine call; `prompt_ids(prompt)` tokenises;
    `sampling(lengths, n, seed)` builds the request parameters; `decode(ids)` gives the text to score."""

    def __init__(self, cfg: MasterConfig, env, loaders: list[PromptLoader], generate: Callable,
                 prompt_ids: Callable[[Prompt], list[int]], sampling: Callable[..., SamplingParams],
                 decode: Callable[[list[int]], str], timer: Callable[[str], ContextManager] | None = None):
        self.cfg, self.env, self.loaders = cfg, env, loaders
        self.timer = timer or (lambda name: contextlib.nullcontext())
        self.generate, self.prompt_ids, self.sampling, self.decode = generate, prompt_ids, sampling, decode
        grpo = cfg.grpo
        self.group_size, self.want = grpo.num_generations_per_prompt, grpo.num_prompts_per_step
        datasets = cfg.data.datasets
        self.shares = split_counts(self.want, [d.weight for d in datasets], [d.num_prompts_per_step for d in datasets])
        self.transforms = [(name, registry.build("reward_transform", name, config=grpo))
                           for name in enabled_transforms(grpo)]
        self.filters = [(name, registry.build("group_filter", name, config=grpo)) for name in enabled_filters(grpo)]
        self.scoring_slots = threading.BoundedSemaphore(cfg.env.num_workers)
        self.score_timeout_s = cfg.env.task_timeout_s
        self.dump = Path(cfg.env.dump_trajectory_path) if cfg.env.dump_trajectory_path else None
        self._dump_lock = threading.Lock()   # async: groups finish on the driver's worker threads
        self.step = 0
        self.evaluation_figures: dict[str, float] = {}   # the last evaluate()'s figures beyond the rewards

    # --- drawing prompts ----------------------------------------------------------------------

    def _draw(self, count: int) -> list[Prompt]:
        """`count` prompts in the step's dataset proportions (exactly the shares for one step's worth)."""
        counts = self.shares if count == self.want else split_counts(count, [float(s) for s in self.shares],
                                                                     [None] * len(self.shares))
        return [p for loader, n in zip(self.loaders, counts) for p in loader.take(n)]

    # --- one batch of groups ------------------------------------------------------------------

    def _score(self, completion: Completion, prompt: Prompt, ids: list[int], max_tokens: int) -> Trajectory:
        text = self.decode(completion.token_ids)
        sample = Sample(token_ids=ids + completion.token_ids, prompt_length=len(ids),
                        rollout_logprobs=list(completion.logprobs))
        trajectory = Trajectory(sample, 0.0, finish_reason=completion.finish_reason, max_tokens=max_tokens,
                                versions=completion.versions)
        try:
            trajectory.raw_reward = float(self.env.score(text, prompt))
            valid = getattr(self.env, "action_valid", None)
            trajectory.action_valid = bool(valid(text)) if valid is not None else True
        except Exception as err:  # any scorer failure is this trajectory's, never the run's
            trajectory.status, trajectory.error = FAILED, f"{type(err).__name__}: {err}"
        return trajectory

    def _score_all(self, jobs: list[tuple[Completion, Prompt, list[int], int]]) -> list[Trajectory]:
        """_score of every job, started in order, env.num_workers at once. Each has env.task_timeout_s from
        its start; a scorer past it fails its trajectory. Daemon threads: a hung scorer keeps its worker
        slot but never keeps the process from exiting."""
        started: dict[int, float] = {}
        results: list[Trajectory | None] = [None] * len(jobs)
        done = [threading.Event() for _ in jobs]

        def run(index: int, job) -> None:
            try:
                results[index] = self._score(*job)
            finally:
                done[index].set()
                self.scoring_slots.release()

        stuck = False
        for index, job in enumerate(jobs):
            if stuck or not self.scoring_slots.acquire(timeout=self.score_timeout_s):
                stuck = True   # every worker is held by a scorer past its time
                results[index] = self._timed_out(job, "waited for a free scoring worker")
                continue
            started[index] = time.monotonic()
            threading.Thread(target=run, args=(index, job), name=f"scorer-{index}", daemon=True).start()
        for index, job in enumerate(jobs):
            if index in started and not done[index].wait(
                    max(0.0, started[index] + self.score_timeout_s - time.monotonic())):
                results[index] = self._timed_out(job, "was scoring")
        return results

    def _timed_out(self, job: tuple[Completion, Prompt, list[int], int], what: str) -> Trajectory:
        completion, _, ids, max_tokens = job
        sample = Sample(token_ids=ids + completion.token_ids, prompt_length=len(ids),
                        rollout_logprobs=list(completion.logprobs))
        return Trajectory(sample, 0.0, status=FAILED, finish_reason=completion.finish_reason, max_tokens=max_tokens,
                          versions=completion.versions, error=f"the environment {what} for longer than "
                          f"env.task_timeout_s ({self.score_timeout_s:g} s)")

    def sample_groups(self, prompts: list[Prompt], seed: int) -> list[Group]:
        """One group per prompt: sampled, scored (FAILED ones sampled again) and reward-transformed."""
        with self.timer("generate"):
            ids = [self.prompt_ids(p) for p in prompts]
            params = self.sampling([len(i) for i in ids], self.group_size, seed)
            completions = self.generate(ids, params)
        groups = [Group(p) for p in prompts]
        with self.timer("reward"):
            jobs = [(c, prompts[c.prompt_index], ids[c.prompt_index], params.max_tokens) for c in completions]
            for completion, trajectory in zip(completions, self._score_all(jobs)):
                groups[completion.prompt_index].trajectories.append(trajectory)
        retry_limit = self.cfg.grpo.retry_limit
        for attempt in range(2, retry_limit + 1):
            failed = [(g, k) for g, group in enumerate(groups) for k, t in enumerate(group.trajectories)
                      if t.status == FAILED]
            if not failed:
                break
            retry_ids = [ids[g] for g, _ in failed]
            retry_params = self.sampling([len(i) for i in retry_ids], 1, seed + 104_729 * attempt)
            with self.timer("generate"):
                completions = self.generate(retry_ids, retry_params)
            with self.timer("reward"):
                jobs = [(c, prompts[failed[c.prompt_index][0]], ids[failed[c.prompt_index][0]],
                         retry_params.max_tokens) for c in completions]
                for completion, again in zip(completions, self._score_all(jobs)):
                    g, k = failed[completion.prompt_index]
                    again.attempts = attempt
                    groups[g].trajectories[k] = again
        failed = [t for group in groups for t in group.trajectories if t.status == FAILED]
        for t in failed:
            t.raw_reward = 0.0
        if failed:
            # one line a batch: a scorer that is broken outright must not flood the log
            print(f"dockyard: {len(failed)} trajectory(ies) FAILED after {retry_limit} attempt(s) "
                  f"(grpo.retry_limit); first error: {failed[0].error}", file=sys.stderr, flush=True)
        self._transform(groups)
        self._dump([(g.prompt, t) for g in groups for t in g.trajectories], seed, "train")
        return groups

    def _dump(self, rows: list[tuple[Prompt, "Trajectory"]], seed: int, name: str) -> None:
        """env.dump_trajectory_path: one jsonl line per trajectory, a file per step (<name>_step_<N>.jsonl)."""
        if self.dump is None:
            return
        self.dump.mkdir(parents=True, exist_ok=True)
        with self._dump_lock, open(self.dump / f"{name}_step_{self.step}.jsonl", "a", encoding="utf-8") as out:
            for prompt, t in rows:
                out.write(json.dumps({
                    "prompt": prompt.input, "label": prompt.label, "dataset": prompt.source, "seed": seed,
                    "response": self.decode(t.sample.token_ids[t.sample.prompt_length:]),
                    "prompt_tokens": t.sample.prompt_length, "response_tokens": t.sample.response_length,
                    "finish_reason": t.finish_reason, "raw_reward": t.raw_reward, "reward": t.reward,
                    "status": t.status, "attempts": t.attempts, "error": t.error}, default=str) + "\n")

    def _transform(self, groups: list[Group]) -> None:
        trajectories = [t for g in groups for t in g.trajectories]
        rewards = torch.tensor([t.raw_reward for t in trajectories], dtype=torch.float64)
        facts = RolloutFacts(
            response_tokens=torch.tensor([t.sample.response_length for t in trajectories]),
            max_tokens=torch.tensor([t.max_tokens for t in trajectories]),
            action_valid=torch.tensor([t.action_valid for t in trajectories], dtype=torch.bool))
        for _, transform in self.transforms:
            rewards = transform(rewards, facts)
        for t, reward in zip(trajectories, rewards.tolist()):
            t.reward = reward

    def _keep(self, group: Group, dropped: dict[str, int]) -> bool:
        for name, keep in self.filters:
            if not keep(group.trajectories):
                dropped[name] += 1
                return False
        return True

    def print_samples(self, groups: list[Group]) -> None:
        shown = [(g.prompt, t) for g in groups for t in g.trajectories][:self.cfg.logger.num_samples_to_print]
        for prompt, t in shown:
            text = self.decode(t.sample.token_ids[t.sample.prompt_length:])
            print(f"  sample (reward {t.reward:g}{', FAILED' if t.status == FAILED else ''}): "
                  f"{str(prompt.input)[:200]!r} -> {text[:300]!r} (label {prompt.label!r})", file=sys.stderr, flush=True)

    def evaluate(self, prompts: list[Prompt], temperature: float) -> list[tuple[str, float]]:
        """One answer per prompt at `temperature` (validation): (the answer's text, reward) each."""
        ids = [self.prompt_ids(p) for p in prompts]
        completions = self.generate(ids, self.sampling([len(i) for i in ids], 1, 0, temperature))
        results: list[tuple[str, float]] = [("", 0.0)] * len(prompts)
        dumped = []
        for completion in completions:
            text = self.decode(completion.token_ids)
            index = completion.prompt_index
            results[index] = (text, float(self.env.score(text, prompts[index])))
            sample = Sample(token_ids=ids[index] + completion.token_ids, prompt_length=len(ids[index]))
            dumped.append((prompts[index], Trajectory(sample, results[index][1], results[index][1],
                                                      finish_reason=completion.finish_reason)))
        self._dump(dumped, 0, "validation")
        return results

    # --- the step -----------------------------------------------------------------------------

    def collect(self, seed: int) -> tuple[list[Group], dict[str, float]]:
        """The groups that train this step (at most num_prompts_per_step, in sampling order), and
        metrics over everything sampled (refills included)."""
        sampler = self.cfg.grpo.sampler
        prompts = self._draw(self.want + sampler.num_oversample)
        kept: list[Group] = []
        sampled: list[Group] = []
        dropped = {name: 0 for name, _ in self.filters}
        refills = 0
        while True:
            groups = self.sample_groups(prompts, seed + 7_919 * refills)
            sampled += groups
            kept += [g for g in groups if self._keep(g, dropped)]
            if len(kept) >= self.want or not sampler.dynamic_sampling:
                break
            if refills == sampler.max_refill_rounds:
                print(f"dockyard: dynamic sampling kept {len(kept)} of {self.want} groups after {refills} refills "
                      "(grpo.sampler.max_refill_rounds); training on those", file=sys.stderr, flush=True)
                break
            refills += 1
            need = self.want - len(kept)
            prompts = self._draw(min(math.ceil(need * sampler.refill_ratio), sampler.max_refill_count))
        kept = kept[:self.want]
        self.print_samples(sampled)
        metrics = self.batch_metrics(sampled, kept, dropped)
        metrics["sampling/refills"] = float(refills)
        return kept, metrics

    def keep_groups(self, groups: list[Group]) -> tuple[list[Group], dict[str, int]]:
        """The groups that pass the configured filters, and how many each filter dropped."""
        dropped = {name: 0 for name, _ in self.filters}
        return [g for g in groups if self._keep(g, dropped)], dropped

    def batch_metrics(self, sampled: list[Group], kept: list[Group], dropped: dict[str, int]) -> dict[str, float]:
        """Reward, sampling and generation figures over everything sampled for a step."""
        every = [t for g in sampled for t in g.trajectories]
        raw = torch.tensor([t.raw_reward for t in every])
        final = torch.tensor([t.reward for t in every])
        metrics = {"reward/mean": float(final.mean()), "reward/std": float(final.std()) if len(every) > 1 else 0.0,
                   "reward/raw_mean": float(raw.mean()),
                   "accuracy": float((raw >= 1.0).float().mean()),
                   "sampling/groups_sampled": float(len(sampled)), "sampling/groups_kept": float(len(kept)),
                   "sampling/failed_trajectories": float(sum(t.status == FAILED for t in every)),
                   "sampling/retried_trajectories": float(sum(t.attempts > 1 for t in every)),
                   "sampling/invalid_actions": float(sum(not t.action_valid for t in every)),
                   # an agent that leaves files shadowing the test machinery, or a verdict the grader
                   # refused: the first signs of a policy learning to fake its grade
                   "reward_hack_suspected": float(sum(bool(t.suspicious) for t in every)),
                   "verifier_errors": float(sum(t.verifier_error is not None for t in every))}
        for name, count in dropped.items():
            metrics[f"sampling/dropped_{name}"] = float(count)
        # sampled tokens only: a multi-turn trajectory's observations (loss mask 0) were not generated
        lengths = [sum(t.sample.loss_mask) if t.sample.loss_mask is not None else t.sample.response_length
                   for t in every]
        metrics["gen/mean_response_tokens"] = sum(lengths) / len(lengths)
        metrics["gen/generated_tokens"] = float(sum(lengths))
        metrics["gen/truncated_fraction"] = sum(t.finish_reason == "length" for t in every) / len(every)
        return metrics
