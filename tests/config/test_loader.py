"""YAML -> OmegaConf -> overrides -> resolve -> MasterConfig, on the shipped configs and small files."""

import math

import pytest

from dockyard.config import ConfigError, load_config
from dockyard.config.resolvers import RESOLVERS
from tests.conftest import problems_of


def cfg(*overrides, config="grpo_tiny.yaml", dirs=()):
    return load_config(config, list(overrides), list(dirs)).config


# --- Hydra override grammar ------------------------------------------------------------------

def test_change_existing_value_and_schema_default_not_in_yaml():
    c = cfg("grpo.num_generations_per_prompt=8", "loss_fn.ratio_clip_c=3.0")
    assert c.grpo.num_generations_per_prompt == 8
    assert c.loss_fn.ratio_clip_c == 3.0  # not written in grpo_tiny.yaml: a schema default, no '+' needed


def test_adding_an_unknown_key_needs_plus():
    problems = problems_of("grpo_tiny.yaml", "env.difficulty=3")
    assert problems == ["env.difficulty: 'env.difficulty=3' sets a key that is not in the config; "
                        "to add a new key use '+env.difficulty=3'"]
    assert cfg("+env.difficulty=3").env.model_extra["difficulty"] == 3


def test_misspelt_key_gets_a_suggestion():
    (problem,) = problems_of("grpo_tiny.yaml", "grpo.num_prompts_per_stp=8")
    assert "did you mean 'grpo.num_prompts_per_step'?" in problem


def test_plus_on_an_existing_key_is_an_error_and_double_plus_forces():
    (problem,) = problems_of("grpo_tiny.yaml", "+grpo.max_num_steps=9")
    assert "adds a key that already exists" in problem
    assert cfg("++grpo.max_num_steps=9").grpo.max_num_steps == 9


def test_plus_into_a_closed_section_is_rejected_by_the_schema():
    (problem,) = problems_of("grpo_tiny.yaml", "+grpo.num_prompt_per_step=8")
    assert problem.startswith("grpo.num_prompt_per_step: unknown key (did you mean 'num_prompts_per_step'?)")


def test_delete_restores_the_schema_default():
    assert cfg("~policy.train_micro_batch_size", "policy.train_global_batch_size=16").policy.train_micro_batch_size == 1


def test_delete_a_missing_key_is_an_error():
    assert problems_of("grpo_tiny.yaml", "~policy.nothing") == [
        "policy.nothing: cannot delete ('~policy.nothing'): the key is not in the config"]


def test_null_lists_quoted_strings_and_dicts():
    c = cfg("policy.generation.top_k=null", "policy.generation.stop_strings=['</answer>', 'a b']",
            "policy.generation.stop_token_ids=[1,2,3]", "data.add_system_prompt='Think, then answer.'",
            "policy.env_vars={OMP_NUM_THREADS: '1'}")
    assert c.policy.generation.top_k is None
    assert c.policy.generation.stop_strings == ["</answer>", "a b"]
    assert c.policy.generation.stop_token_ids == [1, 2, 3]
    assert c.data.add_system_prompt == "Think, then answer."
    assert c.policy.env_vars == {"OMP_NUM_THREADS": "1"}


def test_list_element_override():
    assert cfg("data.datasets.0.name=renamed").data.datasets[0].name == "renamed"


def test_sweeps_and_unparsable_overrides_are_refused():
    (sweep,) = problems_of("grpo_tiny.yaml", "grpo.max_num_steps=1,2")
    assert "sweeps (a=1,2) are not supported" in sweep
    (bad,) = problems_of("grpo_tiny.yaml", "grpo.max_num_steps=[1,")
    assert bad.startswith("override 'grpo.max_num_steps=[1,': cannot parse")


def test_removing_a_required_section():
    assert problems_of("grpo_tiny.yaml", "~loss_fn") == ["loss_fn: required section is missing"]


# --- defaults lists, groups and --config-dir --------------------------------------------------

def test_group_override_in_file_and_on_command_line():
    assert cfg(config="grpo_swe_sglang.yaml").policy.generation.backend == "sglang"
    assert cfg(config="grpo_swe.yaml").policy.generation.backend == "vllm"
    # grpo_tiny overrides /generation to embedded; the command line wins over the file.
    assert cfg("generation=vllm").policy.generation.backend == "vllm"


def test_own_keys_win_over_defaults_and_parent_overrides_reach_children():
    c = cfg(config="grpo_swe_pro.yaml")
    assert c.policy.max_total_sequence_length == 32768  # own value over grpo_swe's 16384
    assert c.env.name == "swe"                           # inherited from grpo_swe
    assert [d.name for d in c.data.datasets] == ["swe_pro"]  # lists are replaced, not appended


def test_user_config_dir_with_group_option_and_imports(write, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # user component modules are imported from the working folder
    write("my_rewards.py", "from dockyard.registry import register\n\n"
          "@register('reward', 'answer_length')\n"
          "def answer_length(completion, label):\n    '''Length of the answer.'''\n    return float(len(completion))\n")
    write("configs/generation/greedy.yaml", "# @package policy.generation\nbackend: embedded\ntemperature: 0.0\n")
    write("configs/my_exp.yaml", "defaults:\n  - grpo_tiny\n  - override /generation: greedy\n  - _self_\n"
          "imports: [my_rewards]\nenv:\n  reward: {name: answer_length}\n")
    c = cfg(config="my_exp.yaml", dirs=[tmp_path / "configs"])
    assert c.policy.generation.temperature == 0.0
    assert c.env.reward.name == "answer_length"
    assert c.name == "grpo_tiny"


def test_user_config_dir_shadows_the_packaged_family(write, tmp_path):
    write("configs/grpo_tiny.yaml", "defaults:\n  - base/grpo_common\n  - _self_\nname: mine\n")
    problems = problems_of("grpo_tiny", config_dirs=[tmp_path / "configs"])
    assert "policy.model_name: missing value (???): set it in the config or with 'policy.model_name=<value>'" in problems


def test_unknown_group_option_lists_the_options():
    (problem,) = problems_of("grpo_tiny.yaml", "generation=tgi")
    assert "no option 'tgi' in group 'generation'; options: embedded, sglang, vllm" in problem


def test_override_of_an_unselected_group(write, tmp_path):
    path = write("exp.yaml", "defaults:\n  - grpo_tiny\n  - override /tokenizer: fast\n  - _self_\n")
    (problem,) = problems_of(str(path))
    assert problem.startswith("override /tokenizer: this group is not selected")


def test_defaults_cycle_is_reported(write):
    a = write("a.yaml", "defaults:\n  - b\nname: a\n")
    write("b.yaml", "defaults:\n  - a\nname: b\n")
    (problem,) = problems_of(str(a))
    assert "defaults cycle: a.yaml -> b.yaml -> a.yaml" in problem


# --- interpolation and resolvers ---------------------------------------------------------------

def test_mul_resolver_derives_a_token_budget():
    c = cfg("policy.max_total_sequence_length=10000", config="grpo_swe.yaml")
    assert c.policy.dynamic_batching.max_tokens_per_gpu == 20000  # ${mul:${policy.max_total_sequence_length}, 2}


def test_resolvers_on_the_command_line():
    c = cfg("grpo.max_num_steps='${mul:${grpo.num_prompts_per_step},3}'",
            "policy.train_micro_batch_size='${div:${policy.train_global_batch_size},8}'",
            "grpo.retry_limit='${max:1,${ceildiv:7,2}}'")
    assert (c.grpo.max_num_steps, c.policy.train_micro_batch_size, c.grpo.retry_limit) == (12, 2, 4)


@pytest.mark.parametrize("name,args,expected", [
    ("mul", (2, 3, 4), 24), ("add", (1, 2.5), 3.5), ("sub", (5, 7), -2), ("div", (8, 4), 2),
    ("div", (7, 2), 3.5), ("floordiv", (7, 2), 3), ("ceildiv", (7, 2), 4), ("min", (3, 1, 2), 1),
    ("max", (3, 1, 2), 3), ("pow2ceil", (5,), 8), ("pow2ceil", (8,), 8)])
def test_resolver_values(name, args, expected):
    result = RESOLVERS[name](*args)
    assert result == expected and type(result) is type(expected)


def test_resolver_refuses_non_numbers():
    (problem,) = problems_of("grpo_tiny.yaml", "grpo.max_num_steps='${mul:2,${policy.model_name}}'")
    assert problem.startswith("grpo.max_num_steps: cannot resolve '${mul:2,${policy.model_name}}'")
    assert "expected a number" in problem


def test_broken_interpolations_are_all_reported():
    problems = problems_of("grpo_tiny.yaml", "policy.model_name='${nowhere.model}'",
                           "logger.log_dir='${runs}/x'")
    assert problems == [
        "policy.model_name: cannot resolve '${nowhere.model}': Interpolation key 'nowhere.model' not found",
        "logger.log_dir: cannot resolve '${runs}/x': Interpolation key 'runs' not found",
    ]


def test_every_missing_value_is_listed_at_once():
    problems = problems_of("grpo_tiny.yaml", "policy.model_name=???", "grpo.max_num_steps=???", "name=???")
    for key in ("name", "policy.model_name", "grpo.max_num_steps"):
        assert f"{key}: missing value (???): set it in the config or with '{key}=<value>'" in problems
    # values interpolated from a missing one say so instead of failing later
    assert any(p.startswith("logger.log_dir: cannot resolve") and "Missing mandatory value: name" in p
               for p in problems)


def test_environment_variable_interpolation(monkeypatch):
    monkeypatch.setenv("DOCKYARD_MODELS_DIR", "/cluster/models")
    assert cfg().policy.model_name == "/cluster/models/tiny-llama"


# --- schema errors -------------------------------------------------------------------------------

def test_wrong_types_and_non_finite_sampling_values():
    problems = problems_of("grpo_tiny.yaml", "policy.generation.temperature=nan", "policy.generation.top_p=inf",
                           "grpo.num_prompts_per_step=four", "policy.precision=fp64")
    assert "policy.generation.temperature: Input should be a finite number (got nan)" in problems
    assert "policy.generation.top_p: Input should be a finite number (got inf)" in problems
    assert any(p.startswith("grpo.num_prompts_per_step: Input should be a valid integer") and "'four'" in p
               for p in problems)
    assert "policy.precision: Input should be 'fp32', 'bf16' or 'fp16' (got 'fp64')" in problems


def test_unknown_component_names_list_the_registered_ones():
    (problem,) = problems_of("grpo_tiny.yaml", "env.reward={name:exact}")
    assert problem.startswith("env.reward.name: unknown reward 'exact'; registered names: ")
    # (a user module another test imported in this process may have registered more names)
    names = problem.split("registered names: ")[1].split(" (got")[0].split(", ")
    assert {"exact_match", "math_answer"} <= set(names) and problem.endswith("(got 'exact')")


def test_unknown_key_in_a_yaml_file(write):
    path = write("exp.yaml", "defaults:\n  - grpo_tiny\n  - _self_\ngrpo:\n  max_num_step: 3\n")
    (problem,) = problems_of(str(path))
    assert problem.startswith("grpo.max_num_step: unknown key (did you mean 'max_num_steps'?)")


def test_open_sections_keep_extra_keys():
    c = cfg(config="grpo_swe.yaml")
    assert c.env.model_extra == {"reward_mode": "tests_pass", "integrity_check": True}


def test_dataset_needs_exactly_one_source():
    (problem,) = problems_of("grpo_tiny.yaml", "data.datasets.0.path=x.jsonl")
    assert problem == "data.datasets[0]: set exactly one of 'path' (a .jsonl/.parquet file) or 'generator'"


def test_import_failure_names_the_module():
    problems = problems_of("grpo_tiny.yaml", "imports=[no_such_module_xyz]")
    assert problems == ["imports[0]: cannot import module 'no_such_module_xyz': ModuleNotFoundError: "
                        "No module named 'no_such_module_xyz'"]


# --- files ----------------------------------------------------------------------------------------

def test_yaml_syntax_error_names_file_and_line(write):
    path = write("broken.yaml", "policy:\n  model_name: x\n  bad: [1, 2\ngrpo: {}\n")
    with pytest.raises(ConfigError) as info:
        load_config(str(path))
    (problem,) = info.value.problems
    assert f"YAML syntax error at {path}:4" in str(problem)
    assert "starts at line 3" in str(problem)


def test_duplicate_keys_are_a_yaml_error(write):
    path = write("dup.yaml", "name: a\nname: b\n")
    (problem,) = problems_of(str(path))
    assert str(path) in problem and "name" in problem


def test_missing_file_names_the_path():
    (problem,) = problems_of("does/not/exist.yaml")
    assert problem.startswith("config file not found: does/not/exist.yaml")


def test_a_list_at_top_level_is_refused(write):
    path = write("list.yaml", "- a\n- b\n")
    assert problems_of(str(path)) == [f"{path} must hold a mapping of config keys at the top level"]


def test_resolved_values_are_plain_python():
    loaded = load_config("grpo_tiny.yaml")
    assert loaded.resolved["policy"]["dynamic_batching"]["max_tokens_per_gpu"] == 256
    assert not math.isnan(loaded.config.policy.generation.temperature)
