"""`hle`: Humanity's Last Exam style questions with one short answer. Rows keep HLE's own columns
(cais/hle as jsonl / parquet): id, question, image, answer, answer_type (exactMatch | multipleChoice;
a multiple-choice question lists its choices in its text and its answer is the letter), rationale,
raw_subject, category. Rows with an image are left out, named (the policy reads text only), as are
rows of another answer_type; the run goes on with the rest.

Each question is asked with HLE's own response format as the system message (Explanation / Exact
Answer or Answer / Confidence). Scoring: the reply's `Exact Answer:` / `Answer:` line against the
label, the letter for multiple choice, else equal after case and space folding or as numbers (HLE's
official grader is a judge model; this is its exact-match part). env.reward, when set, scores that
answer line (the whole reply when there is none) against the label instead.

Set the dataset's input_key to `question`, label_key to `answer`, metadata_key to null.
"""

from __future__ import annotations

from dataclasses import replace

from dockyard.data.datasets import Prompt
from dockyard.envs.answers import LETTERS, AnswerEnvironment, choice_letter, final_answer, same_answer

SYSTEM = {
    "exactMatch": "Your response should be in the following format:\nExplanation: {your explanation for your "
                  "final answer}\nExact Answer: {your succinct, final answer}\nConfidence: {your confidence score "
                  "between 0% and 100% for your answer}",
    "multipleChoice": "Your response should be in the following format:\nExplanation: {your explanation for your "
                      "answer choice}\nAnswer: {your chosen answer}\nConfidence: {your confidence score between 0% "
                      "and 100% for your answer}",
}


class HleEnvironment(AnswerEnvironment):
    NAME = "hle"

    def split_rows(self, prompts: list[Prompt]) -> tuple[list[Prompt], list[tuple[Prompt, str]]]:
        """Each question as HLE asks it: its answer type's response format as the system message."""
        ready, dropped = [], []
        for prompt in prompts:
            row = prompt.metadata
            name = row.get("id") or str(prompt.input)[:40]
            kind = row.get("answer_type", "exactMatch")
            if row.get("image"):
                dropped.append((prompt, f"question {name!r} has an image (text-only policy)"))
            elif kind not in SYSTEM:
                dropped.append((prompt, f"question {name!r}: answer_type {kind!r} is not exactMatch or multipleChoice"))
            elif prompt.label is None or not str(prompt.label).strip():
                dropped.append((prompt, f"question {name!r} has no answer (label_key)"))
            else:
                messages = [{"role": "system", "content": SYSTEM[kind]}, {"role": "user", "content": str(prompt.input)}]
                ready.append(replace(prompt, input=messages, metadata={**row, "answer_type": kind}))
        return ready, dropped

    def score(self, completion: str, prompt: Prompt) -> float:
        label = str(prompt.label).strip()
        answer = final_answer(completion)
        if self.reward is not None:
            return float(self.reward(answer if answer is not None else completion, label))
        if prompt.metadata.get("answer_type") == "multipleChoice":
            return 1.0 if choice_letter(completion, len(LETTERS)) == label.upper()[:1] else 0.0
        return 1.0 if answer is not None and same_answer(answer, label) else 0.0

    def action_valid(self, completion: str) -> bool:
        """The action is the answer line: invalid when the reply has none."""
        return final_answer(completion) is not None

    def reference_reply(self, prompt: Prompt) -> str:
        """The oracle's reply for `dockyard env check`: the reference answer in HLE's response format."""
        line = "Answer" if prompt.metadata.get("answer_type") == "multipleChoice" else "Exact Answer"
        return f"Explanation: the reference answer.\n{line}: {prompt.label}\nConfidence: 100%"
