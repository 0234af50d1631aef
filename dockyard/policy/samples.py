"""What every policy backend and every loop share: the trained samples (exact token ids, advantages,
masks), how a batch is split into micro-batches, the learning-rate shape, and the errors a backend
raises. Framework-neutral: token ids and floats, torch only for the per-sample masks."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from dockyard.errors import DockyardError


@dataclass
class Sample:
    """One trajectory as the trainer sees it: the exact token ids that were sampled."""

    token_ids: list[int]          # prompt + response
    prompt_length: int
    advantage: float = 0.0
    token_advantages: list[float] | None = None  # per response token (OPD); replaces `advantage`
    teacher_logprobs: list[float] | None = None  # OPD: the teacher's logprob of each response token
    loss_mask: list[int] | None = None  # per response token; None = all 1
    rollout_logprobs: list[float] | None = None  # the engine's logprobs of the response tokens
    is_weights: list[float] | None = None  # importance-sampling weights per response token (no gradient)
    images: list[bytes] | None = None  # PNG of each image placeholder token, in order (vision models)

    @property
    def response_length(self) -> int:
        return len(self.token_ids) - self.prompt_length

    def response_mask(self) -> torch.Tensor:
        """1 on response tokens that are trained (observations appended later carry 0)."""
        if self.loss_mask is not None:
            return torch.tensor(self.loss_mask, dtype=torch.float)
        return torch.ones(self.response_length)


def plan_micro_batches(lengths: list[int], micro_size: int, token_budget: int | None) -> list[list[int]]:
    """Group sample indices into micro-batches: `micro_size` at a time, or (with a token budget)
    packed by length so that padded size (longest x count) stays within the budget."""
    if token_budget is None:
        order = list(range(len(lengths)))
        return [order[i:i + micro_size] for i in range(0, len(order), micro_size)]
    batches: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for index in sorted(range(len(lengths)), key=lambda i: lengths[i]):
        if current and max(longest, lengths[index]) * (len(current) + 1) > token_budget:
            batches.append(current)
            current, longest = [], 0
        current.append(index)
        longest = max(longest, lengths[index])
    if current:
        batches.append(current)
    return batches


def plan_shared_prompt_rows(samples: list[Sample], row_budget: int) -> list[list[int]]:
    """Rows of sample indices that share one prompt, in the samples' order: a row holds its prompt once
    and as many of the prompt's responses as fit in `row_budget` tokens (a sample longer than the
    budget still gets a row of its own)."""
    rows: list[list[int]] = []
    open_rows: dict[tuple[int, ...], int] = {}     # prompt -> index of its row still being filled
    used: list[int] = []
    for index, sample in enumerate(samples):
        prompt = tuple(sample.token_ids[:sample.prompt_length])
        row = open_rows.get(prompt)
        if row is not None and used[row] + sample.response_length <= row_budget:
            rows[row].append(index)
            used[row] += sample.response_length
            continue
        open_rows[prompt] = len(rows)
        rows.append([index])
        used.append(len(sample.token_ids))
    return rows


def lr_factor(step: int, warmup: int, total: int, shape: str, min_ratio: float) -> float:
    """LR multiplier after `step` optimizer steps: linear warmup, then constant / linear / cosine."""
    if warmup and step < warmup:
        return (step + 1) / warmup
    if shape == "constant" or total <= warmup:
        return 1.0
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    if shape == "linear":
        return 1.0 - (1.0 - min_ratio) * progress
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


class PolicySetupError(DockyardError, ValueError):
    """The configured policy cannot be built as asked (named, before anything trains)."""


class TrainingInterrupted(Exception):
    """A mini-batch ended before its optimizer step (a stop was agreed); nothing was changed."""


def same_count_on_every_rank(batches: list[list[int]]) -> list[list[int]]:
    """`batches` padded with empty micro-batches to the most any rank has: each forward is a collective
    (FSDP's gathers, TP's reductions), so every rank runs as many."""
    import torch.distributed as dist

    count = torch.tensor([len(batches)], dtype=torch.long)
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(count, op=dist.ReduceOp.MAX)
    return batches + [[] for _ in range(int(count) - len(batches))]
