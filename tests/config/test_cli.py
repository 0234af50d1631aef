"""`dockyard validate` as a user runs it: exit 2, every problem named, never a traceback."""

import pytest

from tests.conftest import REPO, run_cli

BASE = "defaults:\n  - grpo_tiny\n  - _self_\n"

BAD_FILES = {
    "wrong_type.yaml": (BASE + "grpo:\n  num_prompts_per_step: many\n", "grpo.num_prompts_per_step"),
    "nan_temperature.yaml": (BASE + "policy:\n  generation:\n    temperature: .nan\n",
                             "policy.generation.temperature: Input should be a finite number"),
    "inf_top_p.yaml": (BASE + "policy:\n  generation:\n    top_p: .inf\n", "policy.generation.top_p"),
    "divisibility.yaml": (BASE + "policy:\n  train_global_batch_size: 6\n", "policy.train_global_batch_size"),
    "unknown_key.yaml": (BASE + "loss_fn:\n  clip_ratio: 0.2\n", "loss_fn.clip_ratio: unknown key"),
    "broken_interpolation.yaml": (BASE + "policy:\n  model_name: ${models}/x\n",
                                  "policy.model_name: cannot resolve '${models}/x'"),
    "syntax.yaml": ("policy:\n  model_name: [unclosed\n", "syntax.yaml:"),
    "unset.yaml": ("defaults:\n  - base/grpo_common\n  - _self_\nname: x\n"
                   "policy:\n  max_total_sequence_length: 64\n",
                   "policy.model_name: missing value (???)"),
    "removed_section.yaml": ("name: x\npolicy: {model_name: m, max_total_sequence_length: 8, train_global_batch_size: 1}\n",
                             "loss_fn: required section is missing"),
}


@pytest.mark.parametrize("name", sorted(BAD_FILES))
def test_bad_config_exits_2_naming_the_field(name, write):
    text, expected = BAD_FILES[name]
    path = write(name, text)
    result = run_cli("validate", "--config", str(path))
    assert result.returncode == 2, result.stdout + result.stderr
    assert expected in result.stderr
    assert "Traceback" not in result.stderr + result.stdout


@pytest.mark.parametrize("override,expected", [
    ("grpo.new_knob=1", "use '+grpo.new_knob=1'"),
    ("~grpo", "grpo: required section is missing"),
    ("policy.generation.temperature=nan", "finite"),
    ("grpo.max_num_steps=[1,", "cannot parse"),
])
def test_bad_override_exits_2(override, expected):
    result = run_cli("validate", "--config", "grpo_tiny.yaml", override)
    assert result.returncode == 2
    assert expected in result.stderr and "Traceback" not in result.stderr


def test_missing_file_exits_2():
    result = run_cli("validate", "--config", "no/such/config.yaml")
    assert result.returncode == 2
    assert "config file not found: no/such/config.yaml" in result.stderr
    assert "Traceback" not in result.stderr


def test_validate_the_whole_family_folder():
    result = run_cli("validate", "configs/")
    assert result.returncode == 0, result.stderr
    count = len(list((REPO / "configs").glob("*.yaml")))
    assert f"{count} ok, 0 invalid" in result.stdout and count >= 33


def test_a_folder_with_one_bad_config_fails(write, tmp_path):
    write("good.yaml", BASE)
    write("bad.yaml", BASE + "grpo:\n  max_num_steps: 0\n")
    result = run_cli("validate", str(tmp_path))
    assert result.returncode == 2
    assert "1 ok, 1 invalid" in result.stdout
    assert "grpo.max_num_steps: Input should be greater than 0" in result.stderr


def test_show_prints_the_resolved_config_with_defaults(tmp_path):
    result = run_cli("validate", "--config", "grpo_swe.yaml", "--show", "policy.max_total_sequence_length=9000",
                     cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "max_tokens_per_gpu: 18000" in result.stdout      # ${mul:...} resolved
    assert "ratio_clip_c: null" in result.stdout             # schema default filled in
    assert "${" not in result.stdout


def test_list_prints_every_kind_with_docs():
    result = run_cli("list")
    assert result.returncode == 0
    for line in ("reward: score a finished trajectory", "  math_answer", "sandbox:", "  bubblewrap"):
        assert line in result.stdout
    only = run_cli("list", "buffer_replay_strategy")
    assert only.stdout.splitlines()[1].split()[0] == "fifo"
    assert run_cli("list", "widgets").returncode == 2


def test_submit_validates_before_anything_is_queued():
    result = run_cli_submit("--config", "grpo_tiny.yaml", "--nodes", "1", "grpo.max_num_steps=0")
    assert result.returncode == 2
    assert "grpo.max_num_steps" in result.stderr and "nothing was submitted" in result.stderr


def run_cli_submit(*args):
    import subprocess
    import sys

    code = "import sys; from dockyard.cli import submit_main; sys.exit(submit_main())"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=REPO, timeout=120)
