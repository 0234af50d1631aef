"""Prompts to token ids and request parameters, and the step collector built on them: what trainer
rank 0 and a data-plane rollout worker (plane/worker.py) share, so both sample a prompt identically."""

from __future__ import annotations

import threading
from pathlib import Path

from dockyard.config.schema import MasterConfig
from dockyard.data.datasets import DatasetError, Prompt, build_messages, prompt_token_ids
from dockyard.generation.engine import SamplingParams
from dockyard.loop.agent_rollouts import AgentRolloutCollector
from dockyard.loop.rollouts import RolloutCollector
from dockyard.models import load_tokenizer


class PromptCodec:
    def __init__(self, cfg: MasterConfig, env):
        self.cfg, self.env = cfg, env
        self.tokenizer = load_tokenizer(cfg.policy.tokenizer_name or cfg.policy.model_name)
        chat = cfg.policy.generation.chat_template
        self.chat_template = Path(chat.path).read_text() if chat.path else None
        self.tokenizing = threading.Lock()

    def prompt_ids(self, prompt: Prompt) -> list[int]:
        messages = build_messages(prompt, self.cfg.data.add_system_prompt, getattr(self.env, "instruction", None))
        with self.tokenizing:   # a fast tokenizer used from two threads at once can fail ("Already borrowed")
            return prompt_token_ids(self.tokenizer, messages, self.chat_template,
                                    self.cfg.policy.generation.chat_template.generation_prompt_kwargs)

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def sampling(self, prompt_lengths: list[int], n: int, temperature: float, seed: int) -> SamplingParams:
        gen = self.cfg.policy.generation
        room = self.cfg.policy.max_total_sequence_length - max(prompt_lengths)
        if room < 1:
            raise DatasetError(f"a prompt of {max(prompt_lengths)} tokens leaves no room to generate within "
                               f"policy.max_total_sequence_length ({self.cfg.policy.max_total_sequence_length}); "
                               "lower data.datasets[].max_prompt_chars")
        max_tokens = min(room, gen.max_new_tokens) if gen.max_new_tokens else room
        return SamplingParams(n=n, max_tokens=max_tokens, temperature=temperature, top_p=gen.top_p, top_k=gen.top_k,
                              stop=list(gen.stop_strings), stop_token_ids=list(gen.stop_token_ids),
                              ignore_eos=gen.ignore_eos, seed=seed)

    def collector(self, loaders: list, generate, timer=None) -> RolloutCollector:
        """The step collector of the config: multi-turn agent episodes (env.agent) or single-turn groups."""
        cfg = self.cfg
        temperature = cfg.policy.generation.temperature
        sampling = lambda lengths, n, seed, t=None: self.sampling(   # noqa: E731
            lengths, n, temperature if t is None else t, seed)
        if cfg.env.agent is not None:   # multi-turn episodes (agent_rollouts.py)
            return AgentRolloutCollector(
                cfg, self.env, loaders, generate=generate, sampling=sampling, decode=self.decode,
                tokenizer=self.tokenizer, chat_template=self.chat_template,
                template_kwargs=cfg.policy.generation.chat_template.generation_prompt_kwargs, timer=timer)
        return RolloutCollector(cfg, self.env, loaders, generate=generate, prompt_ids=self.prompt_ids,
                                sampling=sampling, decode=self.decode, timer=timer)
