"""`math`: single-turn arithmetic / GSM-style tasks. A configured env.reward scores every row; without
one, generated rows (reasoning-gym) are scored by their own task's verifier and file rows by
math_answer."""

from __future__ import annotations

from dockyard import registry
from dockyard.components.rewards import MathAnswer
from dockyard.config.schema.env import EnvConfig
from dockyard.data.datasets import Prompt

DEFAULT_INSTRUCTION = "Give only the final answer."


class MathEnvironment:
    """Arithmetic and GSM-style questions with exact-answer rewards."""

    EXTRA_KEYS = frozenset({"instruction"})   # env.<key> settings beyond the schema's

    def __init__(self, config: EnvConfig):
        extra = config.model_extra or {}
        unknown = sorted(set(extra) - self.EXTRA_KEYS)
        if unknown:
            raise ValueError(f"env.{unknown[0]}: not a math setting (known: {', '.join(sorted(self.EXTRA_KEYS))})")
        self.instruction: str | None = extra.get("instruction", DEFAULT_INSTRUCTION)
        self.extract = MathAnswer().extract
        self.override = (registry.build("reward", config.reward.name, **(config.reward.model_extra or {}))
                         if config.reward is not None else None)
        self.reward = self.override or MathAnswer()
        self._scorers: dict[str, object] = {}

    def score(self, completion: str, prompt: Prompt) -> float:
        entry = prompt.metadata.get("reasoning_gym_entry")
        if entry is None or self.override is not None:
            return float(self.reward(completion, str(prompt.label)))
        answer = self.extract(completion)
        if answer is None:
            return 0.0
        return 1.0 if self._scorer(entry["metadata"]["source_dataset"])(answer, entry) >= 1.0 else 0.0

    def action_valid(self, completion: str) -> bool:
        """The action of a math task is its final answer: invalid when none can be found
        (grpo.invalid_action_penalty applies)."""
        return self.extract(completion) is not None

    def _scorer(self, task: str):
        if task not in self._scorers:
            import reasoning_gym

            self._scorers[task] = reasoning_gym.get_score_answer_fn(task)
        return self._scorers[task]
