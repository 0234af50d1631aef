"""What the reasoning environments (hle, gpqa) share: the final answer of a reply, the choice letter
in it, and whether two answers are the same."""

from __future__ import annotations

import re
import sys

from dockyard.components.rewards import _as_number, _normalise_text
from dockyard.data.datasets import DatasetError, Prompt

LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
_ANSWER_LINE = re.compile(r"^\s*\**(?:exact answer|final answer|answer)\**\s*[:：]\s*(.+?)\s*$", re.IGNORECASE | re.MULTILINE)
_LETTER = re.compile(r"^\(?([A-Z])\)?(?:[.):\s]|$)")
_LAST_LETTER = re.compile(r"(?:\(([A-Z])\)|\b([A-Z])\b)")


def final_answer(completion: str) -> str | None:
    """The text after the last `Answer:` / `Exact Answer:` / `Final answer:` line, else None."""
    found = _ANSWER_LINE.findall(completion)
    return found[-1].strip().strip("*").strip() if found else None


def choice_letter(completion: str, count: int) -> str | None:
    """The chosen letter among the first `count`: from the answer line (`Answer: (B)`, `B.`), else the
    last lone capital letter of the reply among them."""
    valid = LETTERS[:count]
    answer = final_answer(completion)
    if answer is not None:
        match = _LETTER.match(answer.upper() if len(answer) == 1 else answer)
        if match and match.group(1) in valid:
            return match.group(1)
    for paren, bare in reversed(_LAST_LETTER.findall(completion)):
        letter = paren or bare
        if letter in valid:
            return letter
    return None


def same_answer(got: str, want: str) -> bool:
    """Equal after case/space folding and trailing punctuation, or as numbers (1/2 = 0.5)."""
    a, b = _as_number(got.strip().rstrip(".")), _as_number(str(want).strip().rstrip("."))
    if a is not None and b is not None:
        return a == b
    return _normalise_text(got).rstrip(".") == _normalise_text(str(want)).rstrip(".")


def kept_rows(kept: list[Prompt], dropped: list[tuple[Prompt, str]], env: str) -> list[Prompt]:
    """The usable prompts; each row left out is reported with its file, and the run goes on with the rest."""
    for prompt, why in dropped:
        print(f"{env}: {prompt.source_file or prompt.source}: {why}; the row is left out", file=sys.stderr, flush=True)
    if dropped and not kept:
        first = dropped[0][0]
        raise DatasetError(f"{env}: every row of {first.source_file or first.source} was left out "
                           f"(first: {dropped[0][1]})")
    return kept


class AnswerEnvironment:
    """What hle and gpqa share: settings checked by name, an optional env.reward, rows turned into
    prompts (split_rows, by each) with the unusable ones left out, and env check's reference replies."""

    NAME = ""
    EXTRA_KEYS: frozenset = frozenset()

    @classmethod
    def check_settings(cls, config) -> dict:
        """The env settings, checked (ValueError naming the field); the preflight calls it too."""
        extra = dict(config.model_extra or {})
        unknown = sorted(set(extra) - cls.EXTRA_KEYS)
        if unknown:
            known = ", ".join(sorted(cls.EXTRA_KEYS)) or "none beyond the schema's"
            raise ValueError(f"env.{unknown[0]}: not a setting of the {cls.NAME} environment (known: {known})")
        return extra

    def __init__(self, config):
        from dockyard import registry

        self.extra = self.check_settings(config)
        self.reward = (registry.build("reward", config.reward.name, **(config.reward.model_extra or {}))
                       if config.reward is not None else None)

    def split_rows(self, prompts: list[Prompt]) -> tuple[list[Prompt], list[tuple[Prompt, str]]]:
        raise NotImplementedError

    def prepare_prompts(self, prompts: list[Prompt]) -> list[Prompt]:
        return kept_rows(*self.split_rows(prompts), self.NAME)

    @classmethod
    def reference_trials(cls, cfg, source, agent: str):
        return answer_trials(cls, cfg, source, agent)


def answer_trials(env_class, cfg, source, agent: str):
    """`dockyard env check` for an environment whose reply is an answer: the oracle replies with the
    row's reference answer in the asked format (env.reference_reply), the no-op agent with nothing;
    each through the environment's own prompts and scoring. Rows it leaves out are reported apart."""
    from dockyard.envs.check import source_prompts
    from dockyard.envs.terminal_trial import TrialResult

    env = env_class(cfg.env)
    ready, dropped = env.split_rows(source_prompts(cfg, source))
    results = []
    for prompt in ready:
        reply = env.reference_reply(prompt) if agent == "oracle" else ""
        name = str(prompt.metadata.get("id") or prompt.metadata.get("Record ID") or len(results))
        results.append(TrialResult(name, env.score(reply, prompt), 0.0, agent_output=reply))
    return results, [f"{p.source_file or p.source}: {why}" for p, why in dropped]
