"""The math environment scores with each reasoning-gym task's own verifier."""

import pytest

from dockyard import registry
from dockyard.config.schema.data import DatasetConfig
from dockyard.config.schema.env import EnvConfig
from dockyard.data.datasets import Prompt, load_prompts


@pytest.fixture(scope="module")
def env():
    return registry.build("environment", "math", config=EnvConfig(name="math"))


@pytest.mark.parametrize("task", ["basic_arithmetic", "chain_sum", "gsm_symbolic"])
def test_the_right_answer_scores_1_and_a_wrong_one_0(env, task):
    for prompt in load_prompts(DatasetConfig(generator={"name": task, "size": 5, "seed": 1})):
        answer = str(prompt.label)
        assert env.score(f"Let me think. The answer is {answer}", prompt) == 1.0
        assert env.score(f"#### {answer}", prompt) == 1.0
        assert env.score("I do not know", prompt) == 0.0
        wrong = str(int(float(answer)) + 1) if answer.lstrip("-").replace(".", "").isdigit() else "nonsense"
        assert env.score(f"The answer is {wrong}", prompt) == 0.0


def test_file_rows_use_the_configured_reward():
    exact = registry.build("environment", "math", config=EnvConfig(name="math", reward={"name": "exact_match"}))
    prompt = Prompt("Capital of France?", "Paris", {}, "d")
    assert exact.score(" paris ", prompt) == 1.0
    default = registry.build("environment", "math", config=EnvConfig(name="math"))
    assert default.score("so 6 * 7 = 42", Prompt("6*7?", "42", {}, "d")) == 1.0


def test_instruction_is_configurable():
    env = registry.build("environment", "math", config=EnvConfig(name="math", instruction="Answer in digits."))
    assert env.instruction == "Answer in digits."


def test_a_configured_reward_also_scores_generated_rows_and_actions_without_an_answer_are_invalid(env):
    [prompt] = load_prompts(DatasetConfig(generator={"name": "basic_arithmetic", "size": 1, "seed": 1}))
    exact = registry.build("environment", "math", config=EnvConfig(name="math", reward={"name": "exact_match"}))
    right = str(prompt.label)
    assert env.score(f"The answer is {right}", prompt) == 1.0
    assert exact.score(f"The answer is {right}", prompt) == 0.0 and exact.score(right, prompt) == 1.0
    assert env.action_valid("it is 4") and not env.action_valid("I do not know")
