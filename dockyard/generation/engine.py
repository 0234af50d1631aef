"""The embedded generation engine: batched sampling with a KV cache on a transformers causal LM.

Token ids in, token ids and per-token logprobs out. A logprob is log softmax(logits / temperature)
at the sampled token (top-k / top-p only restrict what may be sampled), which is what the trainer
recomputes, so the two can be compared token for token.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass, field
from pathlib import Path

import torch

from dockyard.models import load_causal_lm, load_tokenizer


@dataclass
class SamplingParams:
    n: int = 1
    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    seed: int | None = None


@dataclass
class Completion:
    prompt_index: int
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str  # "stop", "length" or "abort"
    versions: list[int] | None = None   # async: the weights version that sampled each token


SCORE_ROWS = 16


class Aborted(Exception):
    pass


def mergeable(params: SamplingParams) -> tuple:
    """What requests decoded in one batch must share (n, max_tokens and seed may differ)."""
    return (params.temperature, params.top_p, params.top_k, tuple(params.stop), tuple(params.stop_token_ids),
            params.ignore_eos)


@dataclass
class _Job:
    slot: int            # the request it belongs to
    prompt_index: int
    prompt: list[int]
    max_tokens: int


class Engine:
    def __init__(self, model_path: str | Path, device: str = "cpu", dtype: torch.dtype = torch.float32,
                 max_batch_size: int = 64):
        self.device = torch.device(device)
        self.model = load_causal_lm(model_path, dtype=dtype).to(self.device).eval()
        self.tokenizer = load_tokenizer(model_path)
        self.max_batch_size = max_batch_size
        eos = self.model.generation_config.eos_token_id if self.model.generation_config else None
        eos = eos if eos is not None else self.model.config.eos_token_id
        self.eos_token_ids = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        self.pad_token_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        self.weights_version = 0
        # Paused: decoding holds between steps until resumed. Aborted: in-flight requests end now.
        self._running = threading.Event()
        self._running.set()
        self._abort = threading.Event()

    # --- control ------------------------------------------------------------------------------

    def pause(self) -> None:
        self._running.clear()

    def resume(self) -> None:
        self._running.set()

    def abort(self) -> None:
        self._abort.set()
        self._running.set()

    @property
    def paused(self) -> bool:
        return not self._running.is_set()

    # --- weights ------------------------------------------------------------------------------

    def load_weights(self, named_tensors: dict[str, torch.Tensor]) -> None:
        # state_dict names include tied aliases (lm_head.weight of a tied embedding) that a trainer sends
        params = dict(self.model.state_dict(keep_vars=True))
        named_tensors = fused_experts(named_tensors, params)
        unknown = sorted(set(named_tensors) - set(params))
        if unknown:
            raise ValueError(f"unknown parameter names: {', '.join(unknown[:5])}")
        with torch.no_grad():
            for name, tensor in named_tensors.items():
                target = params[name]
                if tuple(target.shape) != tuple(tensor.shape):
                    raise ValueError(f"{name}: shape {tuple(tensor.shape)} does not match {tuple(target.shape)}")
                target.copy_(tensor.to(dtype=target.dtype, device=target.device))
        self.weights_version += 1

    # --- generation ---------------------------------------------------------------------------

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Completion]:
        return self.generate_many([(prompts, params)])[0]

    @torch.inference_mode()
    def generate_many(self, requests: list[tuple[list[list[int]], SamplingParams]]) -> list[list[Completion]]:
        """Several requests decoded as one batch (the server merges concurrent requests this way).
        They must agree on everything but n, max_tokens and seed (see `mergeable`); each request keeps
        its own random stream, so its samples do not depend on what it was batched with."""
        for prompts, params in requests:
            if not prompts or any(not p for p in prompts):
                raise ValueError("every prompt needs at least one token")
            if mergeable(params) != mergeable(requests[0][1]):
                raise ValueError("requests merged into one batch must share their sampling settings")
        self._abort.clear()
        generators = []
        for _, params in requests:
            generator = torch.Generator(device="cpu")
            generator.manual_seed(params.seed if params.seed is not None else torch.seed())
            generators.append(generator)
        jobs = [_Job(slot, i, prompt, params.max_tokens) for slot, (prompts, params) in enumerate(requests)
                for i, prompt in enumerate(prompts) for _ in range(params.n)]
        results: list[list[Completion]] = [[] for _ in requests]
        for start in range(0, len(jobs), self.max_batch_size):
            chunk = jobs[start:start + self.max_batch_size]
            for job, completion in zip(chunk, self._generate_batch(chunk, requests[0][1], generators)):
                results[job.slot].append(completion)
        return results

    @torch.inference_mode()
    def score(self, sequences: list[list[int]]) -> list[list[float]]:
        """Prefill only: [logprob of seq[t] given seq[:t] for t >= 1] per sequence (raw: temperature 1)."""
        if any(len(s) < 2 for s in sequences):
            raise ValueError("every scored sequence needs at least two tokens")
        out: list[list[float]] = []
        # right padding leaves every real token's positions and attention as in a row of its own;
        # SCORE_ROWS rows a forward bound the [rows, length, vocabulary] logits
        for start in range(0, len(sequences), SCORE_ROWS):
            chunk = sequences[start:start + SCORE_ROWS]
            width = max(len(s) for s in chunk)
            ids = torch.full((len(chunk), width), self.pad_token_id, dtype=torch.long)
            mask = torch.zeros((len(chunk), width), dtype=torch.long)
            for row, sequence in enumerate(chunk):
                ids[row, :len(sequence)], mask[row, :len(sequence)] = torch.tensor(sequence), 1
            ids, mask = ids.to(self.device), mask.to(self.device)
            logits = self.model(input_ids=ids, attention_mask=mask).logits[:, :-1].float()
            scored = torch.log_softmax(logits, dim=-1).gather(-1, ids[:, 1:, None])[..., 0]
            out += [scored[row, :len(sequence) - 1].tolist() for row, sequence in enumerate(chunk)]
        return out

    def _sample(self, logits: torch.Tensor, params: SamplingParams, generator: torch.Generator):
        logits = logits.float()
        if params.temperature <= 0:
            tokens = logits.argmax(dim=-1)
            return tokens, torch.log_softmax(logits, dim=-1).gather(-1, tokens[:, None])[:, 0]
        scaled = logits / params.temperature
        logprobs = torch.log_softmax(scaled, dim=-1)
        probs = logprobs.exp()
        if params.top_k is not None and params.top_k < probs.shape[-1]:
            kth = torch.topk(probs, params.top_k, dim=-1).values[:, -1:]
            probs = torch.where(probs < kth, torch.zeros_like(probs), probs)
        if params.top_p < 1.0:
            sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
            before = sorted_probs.cumsum(dim=-1) - sorted_probs
            sorted_probs = torch.where(before >= params.top_p, torch.zeros_like(sorted_probs), sorted_probs)
            probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
        tokens = torch.multinomial(probs.cpu(), 1, generator=generator)[:, 0].to(logits.device)
        return tokens, logprobs.gather(-1, tokens[:, None])[:, 0]

    def _sample_rows(self, logits: torch.Tensor, params: SamplingParams, generators: list[torch.Generator],
                     slots: list[int]):
        """Sample each row with its request's random stream."""
        if len(generators) == 1:
            return self._sample(logits, params, generators[0])
        tokens = torch.empty(len(slots), dtype=torch.long, device=logits.device)
        logprobs = torch.empty(len(slots), dtype=torch.float, device=logits.device)
        for slot in sorted(set(slots)):
            where = torch.tensor([i for i, s in enumerate(slots) if s == slot], device=logits.device)
            tokens[where], logprobs[where] = self._sample(logits[where], params, generators[slot])
        return tokens, logprobs

    def _generate_batch(self, jobs: list[_Job], params: SamplingParams,
                        generators: list[torch.Generator]) -> list[Completion]:
        """Decode every job of the batch. A prompt is prefilled once however many samples it has (the
        KV cache is then copied per sample), and finished rows leave the batch once they are a
        quarter of it, so a few long answers do not keep the whole batch decoding."""
        batch = len(jobs)
        prompt_rows: dict[tuple[int, ...], int] = {}
        for job in jobs:
            prompt_rows.setdefault(tuple(job.prompt), len(prompt_rows))
        prompts = list(prompt_rows)
        width = max(len(p) for p in prompts)
        input_ids = torch.full((len(prompts), width), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, prompt in enumerate(prompts):  # left padding keeps every row's last token aligned
            input_ids[row, width - len(prompt):] = torch.tensor(prompt)
            mask[row, width - len(prompt):] = 1
        input_ids, mask = input_ids.to(self.device), mask.to(self.device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        out = self.model(input_ids=input_ids, attention_mask=mask, position_ids=positions, use_cache=True)
        cache, logits = out.past_key_values, out.logits[:, -1]
        next_position = positions[:, -1] + 1
        if len(prompts) < batch:
            per_job = torch.tensor([prompt_rows[tuple(job.prompt)] for job in jobs], device=self.device)
            cache.reorder_cache(per_job)
            logits, mask, next_position = logits[per_job], mask[per_job], next_position[per_job]

        tokens: list[list[int]] = [[] for _ in range(batch)]
        logprobs: list[list[float]] = [[] for _ in range(batch)]
        reasons: list[str | None] = [None] * batch
        rows = list(range(batch))     # the job of each row still in the batch
        stop_ids = set(params.stop_token_ids) | (set() if params.ignore_eos else self.eos_token_ids)
        for _ in range(max(job.max_tokens for job in jobs)):
            self._running.wait()
            if self._abort.is_set():
                reasons = [r or "abort" for r in reasons]
                break
            chosen, chosen_logprobs = self._sample_rows(logits, params, generators, [jobs[job].slot for job in rows])
            for position, job in enumerate(rows):
                if reasons[job] is not None:
                    continue
                token = int(chosen[position])
                tokens[job].append(token)
                logprobs[job].append(float(chosen_logprobs[position]))
                if token in stop_ids or (params.stop and self._hits_stop_string(tokens[job], params.stop)):
                    reasons[job] = "stop"
                elif len(tokens[job]) >= jobs[job].max_tokens:
                    reasons[job] = "length"
            running = [position for position, job in enumerate(rows) if reasons[job] is None]
            if not running:
                break
            if len(rows) - len(running) >= max(1, len(rows) // 4):
                keep = torch.tensor(running, device=self.device)
                cache.reorder_cache(keep)
                mask, next_position = mask[keep], next_position[keep]
                rows = [rows[position] for position in running]
            feed = torch.tensor([tokens[job][-1] if reasons[job] is None else self.pad_token_id for job in rows],
                                device=self.device)
            mask = torch.cat([mask, torch.ones((len(rows), 1), dtype=mask.dtype, device=self.device)], dim=1)
            out = self.model(input_ids=feed[:, None], attention_mask=mask, position_ids=next_position[:, None],
                             past_key_values=cache, use_cache=True)
            cache, logits = out.past_key_values, out.logits[:, -1]
            next_position = next_position + 1
        return [Completion(jobs[row].prompt_index, tokens[row], logprobs[row], reasons[row] or "length")
                for row in range(batch)]

    def _hits_stop_string(self, generated: list[int], stops: list[str]) -> bool:
        tail = self.tokenizer.decode(generated[-16:], skip_special_tokens=False)
        return any(stop in tail for stop in stops)


_EXPERT = re.compile(r"(.+\.experts)\.(\d+)\.(gate|up|down)_proj\.weight")


def fused_experts(named: dict[str, torch.Tensor], params: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Trainers send weights under the HF checkpoint's names (what vLLM loads); transformers keeps a
    mixture's experts fused in memory, [experts, 2 x width, hidden] for gate and up (gate first) and
    [experts, hidden, width] for down. Per-expert weights become those fused tensors here."""
    experts: dict[str, dict[tuple[str, int], torch.Tensor]] = {}
    out = {}
    for name, tensor in named.items():
        match = _EXPERT.fullmatch(name)
        if match is None or name in params or f"{match[1]}.down_proj" not in params:
            out[name] = tensor
            continue
        experts.setdefault(match[1], {})[(match[3], int(match[2]))] = tensor
    for prefix, parts in experts.items():
        count = params[f"{prefix}.down_proj"].shape[0]
        missing = [f"{prefix}.{e}.{kind}_proj.weight" for e in range(count) for kind in ("gate", "up", "down")
                   if (kind, e) not in parts]
        if missing:
            raise ValueError(f"expert weights are incomplete: {', '.join(missing[:3])} missing")
        out[f"{prefix}.gate_up_proj"] = torch.stack([torch.cat([parts["gate", e], parts["up", e]])
                                                      for e in range(count)])
        out[f"{prefix}.down_proj"] = torch.stack([parts["down", e] for e in range(count)])
    return out
