"""Rows that hold a prompt once and several of its responses (policy.dynamic_batching.share_prompts),
laid out as the torch backends feed them to a model with a 4-D attention mask.

A row is [prompt | response 1 | response 2 | ... | padding]. Each response attends to the prompt and
to its own earlier tokens and takes the positions it had after the prompt, so every logprob is the one
a row of its own gives (up to floating-point summation order). A row of one sample is the plain
right-padded row, so a backend can use this layout for both."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dockyard.policy.samples import Sample, plan_micro_batches, plan_shared_prompt_rows


def row_length(samples: list[Sample], row: list[int]) -> int:
    return samples[row[0]].prompt_length + sum(samples[i].response_length for i in row)


def plan_shared_micro_batches(samples: list[Sample], micro_size: int, token_budget: int) -> list[list[int]]:
    """Sample indices per micro-batch, whole shared-prompt rows at a time, packed by the rows' lengths."""
    rows = plan_shared_prompt_rows(samples, token_budget)
    return [[index for r in group for index in rows[r]] for group in
            plan_micro_batches([row_length(samples, row) for row in rows], micro_size, token_budget)]


def plan_batches(samples: list[Sample], micro_size: int, batching, share_prompts: bool) -> list[list[int]]:
    """Sample indices per micro-batch as policy.dynamic_batching (`batching`) asks: whole shared-prompt rows,
    packed by token budget, or `micro_size` at a time."""
    if share_prompts:
        return plan_shared_micro_batches(samples, micro_size, batching.max_tokens_per_gpu)
    return plan_micro_batches([len(s.token_ids) for s in samples], micro_size,
                              batching.max_tokens_per_gpu if batching.enabled else None)


@dataclass
class RowLayout:
    ids: torch.Tensor           # [rows, width] token ids, right-padded with 0
    positions: torch.Tensor     # [rows, width] each response restarts after its prompt
    allowed: torch.Tensor       # [rows, 1, width, width] bool: query may attend to key
    source_row: torch.Tensor    # per response token (in output order): the row and position whose
    source_pos: torch.Tensor    #   hidden state predicts it
    targets: torch.Tensor       # the response tokens themselves
    where: tuple[torch.Tensor, torch.Tensor]   # their place in the [samples, responses] output
    responses: int              # the longest response: the output's width
    samples: int                # the output's height

    @property
    def first(self) -> int:
        """The first position that predicts a response token (the shortest prompt's last)."""
        return int(self.source_pos.min())

    def padded(self, rows: int, width: int) -> "RowLayout":
        """The same rows in a [rows, width] shape (padding rows and columns attend to themselves only), for
        a schedule that sends every micro-batch's activations in one fixed shape."""
        ids = torch.zeros((rows, width), dtype=torch.long)
        positions = torch.zeros((rows, width), dtype=torch.long)
        allowed = torch.eye(width, dtype=torch.bool).expand(rows, 1, width, width).clone()
        r, w = self.ids.shape
        ids[:r, :w], positions[:r, :w], allowed[:r, :, :w, :w] = self.ids, self.positions, self.allowed
        return RowLayout(ids, positions, allowed, self.source_row, self.source_pos, self.targets, self.where,
                         self.responses, self.samples)

    def scatter(self, values: torch.Tensor) -> torch.Tensor:
        """Per-token values in output order -> [samples, responses], right-aligned, zeros elsewhere."""
        out = torch.zeros((self.samples, self.responses), dtype=values.dtype, device=values.device)
        return out.index_put((self.where[0].to(values.device), self.where[1].to(values.device)), values)


def layout_rows(samples: list[Sample], rows: list[list[int]]) -> RowLayout:
    """The layout of `rows` (lists of indices into `samples` that share a prompt; every sample in one row)."""
    width = max(row_length(samples, row) for row in rows)
    ids = torch.zeros((len(rows), width), dtype=torch.long)
    positions = torch.zeros((len(rows), width), dtype=torch.long)
    allowed = torch.zeros((len(rows), 1, width, width), dtype=torch.bool)
    source_row, source_pos, token, out_row, out_col = [], [], [], [], []
    responses = max(1, max(s.response_length for s in samples))
    for r, row in enumerate(rows):
        prompt_length = samples[row[0]].prompt_length
        ids[r, :prompt_length] = torch.tensor(samples[row[0]].token_ids[:prompt_length])
        positions[r, :prompt_length] = torch.arange(prompt_length)
        allowed[r, 0, :prompt_length, :prompt_length] = torch.ones(prompt_length, prompt_length,
                                                                   dtype=torch.bool).tril()
        start = prompt_length
        for index in row:
            sample = samples[index]
            n = sample.response_length
            end = start + n
            ids[r, start:end] = torch.tensor(sample.token_ids[prompt_length:])
            positions[r, start:end] = torch.arange(prompt_length, prompt_length + n)
            allowed[r, 0, start:end, :prompt_length] = True
            allowed[r, 0, start:end, start:end] = torch.ones(n, n, dtype=torch.bool).tril()
            # response token j is predicted at the position before it: the prompt's last, then its own
            source_row += [r] * n
            source_pos += ([prompt_length - 1] + list(range(start, end - 1)))[:n]
            token += sample.token_ids[prompt_length:]
            out_row += [index] * n
            out_col += list(range(responses - n, responses))
            start = end
        allowed[r, 0, torch.arange(start, width), torch.arange(start, width)] = True   # padding sees itself
    as_long = lambda values: torch.tensor(values, dtype=torch.long)  # noqa: E731
    return RowLayout(ids, positions, allowed, as_long(source_row), as_long(source_pos), as_long(token),
                     (as_long(out_row), as_long(out_col)), responses, len(samples))
