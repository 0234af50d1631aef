"""The local presets of the config family's environments (swe single shot and agentic, swe on the jax
backend, swe_pro,
program_bench, hle, gpqa, gdpval single shot and agentic, osworld) each train a step in this process (loop_run): the tiny model's
replies go through the environment's own prompts, sandboxes and scoring, and every trajectory is
scored without an error."""

import json

import pytest

from dockyard.sandboxes.bubblewrap import bwrap_path
from tests.conftest import REPO

TASKS = REPO / "tasks"
SMALL = ("grpo.max_num_steps=1", "checkpointing.enabled=false", "policy.generation.max_new_tokens=24",
         "grpo.num_prompts_per_step=2", "grpo.num_generations_per_prompt=2", "policy.train_global_batch_size=4",
         "policy.train_micro_batch_size=2", "env.dump_trajectory_path=dump",
         "grpo.filters.identical_reward=false")   # the tiny model earns the same reward everywhere

PRESETS = {   # each preset's own task paths (tasks/... from the run's folder), smaller where it matters
    "grpo_swe_local.yaml": (),
    "grpo_swe_local.yaml+agent": ("env.agent=tool_calling", "grpo.max_rollout_turns=2", "+env.tool_format=plain",
                                  "data.datasets.0.input_key=problem_statement"),   # the agent reads the code itself
    "grpo_swe_jax_local.yaml": (),   # the jax trainer backend, its layers recomputed (jax_cfg.remat)
    "grpo_swe_pro_local.yaml": ("policy.dtensor_cfg.context_parallel_size=1", "cluster.cpu_ranks_per_node=1"),
    "grpo_program_bench_local.yaml": (),
    "grpo_hle_local.yaml": (),
    "gpqa_local.yaml": (),
    "grpo_gdpval_local.yaml": (),
    "grpo_gdpval_agentic_local.yaml": ("grpo.max_rollout_turns=2", "policy.max_total_sequence_length=1024"),
    "grpo_osworld_local.yaml": ("grpo.max_rollout_turns=2",),   # desktops in bubblewrap, the a11y tree as text
}


@pytest.mark.skipif(bwrap_path() is None, reason="bubblewrap is not installed (tools/install.sh)")
@pytest.mark.parametrize("preset", list(PRESETS))
def test_each_environment_preset_trains_a_step(loop_run, tiny_model, tmp_path, preset):
    (tmp_path / "tasks").symlink_to(TASKS)
    run = loop_run(tmp_path, f"policy.model_name={tiny_model}", *SMALL, *PRESETS[preset], config=preset.split("+")[0])
    assert "Traceback" not in run.output
    [metrics] = [json.loads(line) for line in next(tmp_path.glob("runs/*/logs/metrics.jsonl")).read_text().splitlines()
                 if '"train/loss"' in line]
    assert metrics["step"] == 1
    records = [json.loads(line) for line in (tmp_path / "dump" / "train_step_1.jsonl").read_text().splitlines()]
    assert len(records) >= 4   # hle samples extra groups (grpo.sampler.num_oversample)
    assert all(r["error"] is None for r in records), [r["error"] for r in records]
    if preset == "gpqa_local.yaml":   # the answers were dealt into lettered choices
        assert all("\n(A) " in r["prompt"] and r["label"] in "ABCD" for r in records)
    if preset == "grpo_hle_local.yaml":
        assert all(r["prompt"][0]["role"] == "system" for r in records)
        assert "val/accuracy" in json.loads(next(tmp_path.glob("runs/*/logs/metrics.jsonl")).read_text().splitlines()[0])
    if preset == "grpo_gdpval_agentic_local.yaml":
        assert all(r["turns"] for r in records)
    if preset == "grpo_osworld_local.yaml":   # each episode's desktop was set up, acted on and evaluated
        assert all(r["turns"] and "reward" in r["sandbox_events"][-1] for r in records)
    if preset == "grpo_swe_local.yaml+agent":   # the agent's episodes ended with their diff scored
        assert all(r["turns"] and "patch" in r["sandbox_events"][-1] for r in records)
