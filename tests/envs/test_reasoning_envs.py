"""hle and gpqa: their published row formats into prompts (HLE's response format, GPQA's answers dealt
into letters with a fixed seed), answer extraction and scoring, rows left out by name, and
`dockyard env check` on the shipped sets."""

import csv
import io
import json
import re

import pytest

from dockyard.config import load_config
from dockyard.config.schema.data import DatasetConfig
from dockyard.config.schema.env import EnvConfig, RewardSpec
from dockyard.data.datasets import DatasetError, load_prompts
from dockyard.envs.answers import choice_letter, final_answer, same_answer
from dockyard.envs.check import check
from dockyard.envs.gpqa import GpqaEnvironment
from dockyard.envs.hle import HleEnvironment
from tests.conftest import REPO

GPQA = REPO / "tasks" / "gpqa" / "gpqa_local.csv"
HLE = REPO / "tasks" / "hle" / "hle_local.jsonl"


def gpqa_prompts(path=GPQA, seed=0):
    env = GpqaEnvironment(EnvConfig(name="gpqa", choices_shuffle_seed=seed))
    rows = load_prompts(DatasetConfig(path=str(path), input_key="Question", label_key="Correct Answer", metadata_key=None))
    return env, env.prepare_prompts(rows)


def test_answer_lines_letters_and_equal_answers():
    assert final_answer("Explanation: ...\nExact Answer: 42\nConfidence: 90%") == "42"
    assert final_answer("**Answer:** (C)") == "(C)"
    assert final_answer("no answer line here") is None
    assert choice_letter("Explanation: hmm\nAnswer: B\nConfidence: 60%", 4) == "B"
    assert choice_letter("I think the answer is (D).", 4) == "D"
    assert choice_letter("Answer: E", 4) is None       # not among the four choices
    assert same_answer("40,320", "40320") and same_answer("0.5", "1/2") and same_answer("Helium.", "helium")
    assert not same_answer("41", "40")


def test_gpqa_deals_the_answers_into_letters_with_the_seed():
    env, prompts = gpqa_prompts()
    assert len(prompts) == 10
    first = prompts[0]
    assert re.findall(r"^\(([A-Z])\) ", first.input, re.M) == ["A", "B", "C", "D"]
    assert first.input.startswith("A particle is in the ground state")
    correct = first.metadata["Correct Answer"]
    assert f"({first.label}) {correct}" in first.input        # the label is the correct answer's letter
    letters = [p.label for p in prompts]
    assert len(set(letters)) > 1                              # the correct answer is not always in one place
    assert letters == [p.label for p in gpqa_prompts()[1]]    # the same seed deals the same way
    assert letters != [p.label for p in gpqa_prompts(seed=1)[1]]
    assert env.score(f"Reasoning...\nAnswer: {first.label}", first) == 1.0
    wrong = "ABCD".replace(first.label, "")[0]
    assert env.score(f"Answer: {wrong}", first) == 0.0 and env.score("I cannot tell.", first) == 0.0
    assert env.action_valid("Answer: C") and not env.action_valid("no idea")


def test_gpqa_reward_override_scores_the_letter(tmp_path):
    env = GpqaEnvironment(EnvConfig(name="gpqa", reward=RewardSpec(name="exact_match")))
    rows = load_prompts(DatasetConfig(path=str(GPQA), input_key="Question", label_key="Correct Answer", metadata_key=None))
    prompt = env.prepare_prompts(rows)[1]
    assert env.score(f"Long reasoning.\nAnswer: ({prompt.label})", prompt) == 1.0


def test_gpqa_rows_without_wrong_answers_are_left_out_by_name(tmp_path, capsys):
    path = tmp_path / "g.csv"
    with open(GPQA, newline="") as source, open(path, "w", newline="") as target:
        rows = list(csv.DictReader(source))
        rows[2]["Incorrect Answer 1"] = rows[2]["Incorrect Answer 2"] = rows[2]["Incorrect Answer 3"] = ""
        writer = csv.DictWriter(target, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    _, prompts = gpqa_prompts(path)
    assert len(prompts) == 9
    assert f"gpqa: {path}: question 'dockyard-gpqa-002' needs a correct answer" in capsys.readouterr().err


def test_hle_asks_in_its_response_format_and_scores_the_answer_line():
    env = HleEnvironment(EnvConfig(name="hle"))
    prompts = env.prepare_prompts(load_prompts(DatasetConfig(path=str(HLE), input_key="question", label_key="answer",
                                                             metadata_key=None)))
    exact = next(p for p in prompts if p.metadata["answer_type"] == "exactMatch")
    choice = next(p for p in prompts if p.metadata["answer_type"] == "multipleChoice")
    assert exact.input[0]["role"] == "system" and "Exact Answer:" in exact.input[0]["content"]
    assert "Answer: {your chosen answer}" in choice.input[0]["content"]
    assert env.score(f"Explanation: x\nExact Answer: {exact.label}\nConfidence: 80%", exact) == 1.0
    assert env.score(f"Explanation: x\nExact Answer: {exact.label}1\nConfidence: 80%", exact) == 0.0
    assert env.score(f"The answer is {exact.label}.", exact) == 0.0   # no answer line: HLE's format is part of the task
    assert env.score(f"Explanation: x\nAnswer: {choice.label}\nConfidence: 50%", choice) == 1.0
    assert env.score("Explanation: x\nAnswer: A\nConfidence: 50%", choice) == (1.0 if choice.label == "A" else 0.0)


def test_hle_leaves_out_image_rows_and_unknown_answer_types(tmp_path, capsys):
    rows = [json.loads(line) for line in HLE.read_text().splitlines()]
    rows[0]["image"] = "data:image/png;base64,iVBORw0KGgo="
    rows[1]["answer_type"] = "freeForm"
    path = tmp_path / "h.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    env = HleEnvironment(EnvConfig(name="hle"))
    prompts = env.prepare_prompts(load_prompts(DatasetConfig(path=str(path), input_key="question", label_key="answer",
                                                             metadata_key=None)))
    assert len(prompts) == len(rows) - 2
    err = capsys.readouterr().err
    assert "question 'dockyard-hle-000' has an image" in err and "answer_type 'freeForm'" in err
    every_image = [dict(r, image="x") for r in rows]
    path.write_text("".join(json.dumps(r) + "\n" for r in every_image))
    with pytest.raises(DatasetError, match="every row of .* was left out"):
        env.prepare_prompts(load_prompts(DatasetConfig(path=str(path), input_key="question", label_key="answer",
                                                       metadata_key=None)))


@pytest.mark.parametrize("config,count", [("gpqa_local.yaml", 10), ("grpo_hle_local.yaml", 10)])
def test_env_check_on_the_shipped_sets(config, count):
    cfg = load_config(config, ["models_dir=models"]).config
    source = str(GPQA if "gpqa" in config else HLE)
    for agent, mean in (("oracle", "1.00"), ("noop", "0.00")):
        out = io.StringIO()
        assert check(cfg, source, agent, out) == 0, out.getvalue()
        assert f"mean reward {mean} over {count} tasks" in out.getvalue()


def test_unknown_settings_are_refused_by_name():
    with pytest.raises(ValueError, match="env.choices_seed: not a setting of the gpqa environment"):
        GpqaEnvironment(EnvConfig(name="gpqa", choices_seed=1))
    with pytest.raises(ValueError, match="env.choices_shuffle_seed: must be a whole number"):
        GpqaEnvironment(EnvConfig(name="gpqa", choices_shuffle_seed="x"))
    with pytest.raises(ValueError, match="env.instruction: not a setting of the hle environment .known: none"):
        HleEnvironment(EnvConfig(name="hle", instruction="x"))
