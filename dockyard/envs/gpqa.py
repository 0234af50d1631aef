"""`gpqa`: GPQA multiple-choice science questions. Rows keep GPQA's own columns (the csv the authors
publish, or the same columns as jsonl / parquet): Question, Correct Answer, Incorrect Answer 1-3,
Record ID. The environment deals the four answers into A-D in an order fixed by
env.choices_shuffle_seed and the row's Record ID (the same on every run and every rank, different
between questions), so the correct letter is not always the same.

Set the dataset's input_key to the question column, label_key to the correct answer's and metadata_key
to null (the row holds the incorrect answers). A row with fewer than two distinct answers is left out,
named, and the run goes on.

Scoring: the letter of the reply's `Answer:` line (else its last lone letter among the choices)
against the correct one. env.reward, when set, scores that letter against the correct letter instead.
Extra env keys: choices_shuffle_seed (0), instruction (appended to each question).
"""

from __future__ import annotations

import random
from dataclasses import replace

from dockyard.config.schema.env import EnvConfig
from dockyard.data.datasets import Prompt
from dockyard.envs.answers import LETTERS, AnswerEnvironment, choice_letter

INCORRECT = ("Incorrect Answer 1", "Incorrect Answer 2", "Incorrect Answer 3")
DEFAULT_INSTRUCTION = "Think it through, then end with a line `Answer: X`, X the letter of your choice."


class GpqaEnvironment(AnswerEnvironment):
    NAME = "gpqa"
    EXTRA_KEYS = frozenset({"choices_shuffle_seed", "instruction"})

    @classmethod
    def check_settings(cls, config: EnvConfig) -> dict:
        extra = super().check_settings(config)
        seed = extra.get("choices_shuffle_seed", 0)
        if not isinstance(seed, int) or isinstance(seed, bool):
            raise ValueError(f"env.choices_shuffle_seed: must be a whole number, got {seed!r}")
        return extra

    def __init__(self, config: EnvConfig):
        super().__init__(config)
        self.seed = self.extra.get("choices_shuffle_seed", 0)
        self.instruction = self.extra.get("instruction", DEFAULT_INSTRUCTION)

    def split_rows(self, prompts: list[Prompt]) -> tuple[list[Prompt], list[tuple[Prompt, str]]]:
        """Each question with its answers dealt into lettered choices; the label becomes the letter."""
        ready, problems = [], []
        for prompt in prompts:
            row, correct = prompt.metadata, str(prompt.label or "").strip()
            record = row.get("Record ID") or str(prompt.input)
            wrong = [str(row[key]).strip() for key in INCORRECT if str(row.get(key) or "").strip()]
            if not correct or not wrong:
                problems.append((prompt, f"question {record!r} needs a correct answer (label_key) and "
                                         f"at least one of {', '.join(INCORRECT)}"))
                continue
            choices = [correct, *wrong]
            random.Random(f"{self.seed}:{record}").shuffle(choices)
            letter = LETTERS[choices.index(correct)]
            text = str(prompt.input).strip() + "\n\n" + "\n".join(f"({LETTERS[i]}) {c}" for i, c in enumerate(choices))
            ready.append(replace(prompt, input=text, label=letter,
                                 metadata={**row, "choices": choices, "answer_letter": letter}))
        return ready, problems

    def _letter(self, completion: str, prompt: Prompt) -> str | None:
        return choice_letter(completion, len(prompt.metadata.get("choices", LETTERS[:4])))

    def score(self, completion: str, prompt: Prompt) -> float:
        letter = self._letter(completion, prompt)
        if letter is None:
            return 0.0
        if self.reward is not None:
            return float(self.reward(letter, str(prompt.label)))
        return 1.0 if letter == prompt.label else 0.0

    def action_valid(self, completion: str) -> bool:
        """The action is the chosen letter: invalid when none can be found."""
        return choice_letter(completion, len(LETTERS)) is not None

    def reference_reply(self, prompt: Prompt) -> str:
        """The oracle's reply for `dockyard env check`."""
        return f"Answer: {prompt.label}"
