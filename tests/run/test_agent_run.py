"""The multi-turn terminal preset end to end (`dockyard run`, and its async variant in this process):
the agent collector inside the GRPO loop, sandboxes, the tasks' tests, training on masked multi-turn
samples, trajectory dumps."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from dockyard.sandboxes.bubblewrap import bwrap_path
from tests.conftest import REPO

pytestmark = pytest.mark.skipif(bwrap_path() is None, reason="bubblewrap is not installed (tools/install.sh)")


def checkpoint_weights(run: Path, step: int) -> dict[str, torch.Tensor]:
    dcp_to_torch_save(run / "checkpoints" / f"step_{step}" / "dcp", run / f"weights_{step}.pt")
    return torch.load(run / f"weights_{step}.pt", weights_only=False)["model"]


def small_preset(tiny_model) -> tuple[str, ...]:
    """The terminal preset on the tiny model, small: 2 prompts x 2 episodes a step, short turns."""
    return (f"models_dir={tiny_model.parent}", f"policy.model_name={tiny_model}",
            f"data.datasets.0.path={REPO / 'tasks' / 'terminal_bench' / 'tasks.jsonl'}",
            "policy.max_total_sequence_length=512", "policy.generation.max_new_tokens=24", "grpo.num_prompts_per_step=2",
            "grpo.num_generations_per_prompt=2", "policy.train_global_batch_size=4",
            "policy.dynamic_batching.enabled=false", "checkpointing.enabled=false")


def run_preset(tiny_model, workdir, *overrides: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dockyard.cli", "run", "--config", "grpo_terminal_bench_local.yaml",
                           *small_preset(tiny_model), *overrides], cwd=workdir, capture_output=True, text=True,
                          timeout=600)


def test_the_terminal_preset_trains_a_step_on_multi_turn_episodes(tiny_model, tmp_path):
    result = run_preset(tiny_model, tmp_path, "grpo.max_rollout_turns=2", "grpo.max_num_steps=1")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    run = tmp_path / "runs" / "grpo_terminal_bench_local"
    [metrics] = [json.loads(line) for line in (run / "logs" / "metrics.jsonl").read_text().splitlines()]
    assert metrics["step"] == 1 and metrics["train/kept_fraction"] == 1.0 and "train/loss" in metrics
    records = [json.loads(line) for line in (run / "trajectories" / "train_step_1.jsonl").read_text().splitlines()]
    assert len(records) == 4
    assert all(r["error"] is None and r["turns"] and "tests" in r["sandbox_events"][-1] for r in records)
    assert {r["task"]["name"] for r in records} <= {p.name for p in (REPO / "tasks" / "terminal_bench").iterdir()}


def test_the_terminal_preset_runs_async_with_partial_rollouts(loop_run, tiny_model, tmp_path):
    """The agent episodes in the async loop (in this process: loop_run): each turn is a request under
    one weights version (or continued across a refit), every turn's versions are in the trajectory
    dump, and a step trains groups at most one version old."""
    loop_run(
        tmp_path, *small_preset(tiny_model), "grpo.max_rollout_turns=3", "grpo.max_num_steps=3", "grpo.async_grpo.enabled=true",
        "grpo.async_grpo.max_staleness_steps=1", "grpo.async_grpo.partial_rollout=true",
        "grpo.async_grpo.mask_offpolicy_in_partial_rollout=true", "loss_fn.is_correction.enabled=true",
        "loss_fn.is_correction.lower_bound=0.5", "loss_fn.is_correction.upper_bound=2.0", "cluster.colocate=false",
        "cluster.num_nodes=2", "cluster.trainer.num_nodes=1", "cluster.rollout.num_nodes=1",
        config="grpo_terminal_bench_local.yaml")
    run = tmp_path / "runs" / "grpo_terminal_bench_local"
    rows = [json.loads(line) for line in (run / "logs" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all(max(r["async/lag"]) <= 1 for r in rows) and rows[0]["async/lag"] == [0, 0]
    records = [json.loads(line) for path in sorted((run / "trajectories").glob("train_step_*.jsonl"))
               for line in path.read_text().splitlines()]
    assert len(records) >= 12    # every episode sampled (some run ahead of the last step)
    turns = [turn for r in records for turn in r["turns"]]
    assert turns and all(turn["weights_versions"] for turn in turns)
    assert {v for turn in turns for v in turn["weights_versions"]} >= {0, 1}


def test_the_agent_recipe_validates_per_family_and_resumes_mid_grpo_exactly(loop_run, tiny_model, tmp_path):
    """grpo_terminal_agent_smol on a generated task set (the tiny model standing in for the SFT
    checkpoint): validation on the held-out split at the start reports accuracy per family and the
    episodes' turns, invalid actions and timeouts, and dumps every validation episode; a run stopped
    after step 1 and started again ends with the weights of a run that went straight through."""
    from dockyard.envs.terminal_families.splits import SplitPlan, generate

    data = tmp_path / "data"
    generate(SplitPlan(train_per_family=1, heldout_per_family=1, unseen_per_family=1), data / "terminal_families")
    recipe = (f"data_dir={data}", f"policy.model_name={tiny_model}", "policy.tokenizer_name=null",
              "policy.max_total_sequence_length=512", "policy.generation.max_new_tokens=24", "grpo.num_prompts_per_step=2",
              "grpo.num_generations_per_prompt=2", "policy.train_global_batch_size=4", "policy.train_micro_batch_size=2",
              "grpo.max_rollout_turns=2", "checkpointing.save_period=1", "checkpointing.export_hf=false")
    straight, split = tmp_path / "straight", tmp_path / "split"
    loop_run(straight, *recipe, "grpo.max_num_steps=2", config="grpo_terminal_agent_smol.yaml")
    run = straight / "runs" / "grpo_terminal_agent_smol"
    first = json.loads((run / "logs" / "metrics.jsonl").read_text().splitlines()[0])
    assert first["step"] == 0
    families = {key.split("/")[-1] for key in first if key.startswith("val/accuracy/")}
    assert len(families) == 10 and not families & {"log_summary", "csv_join"}   # the held-out split: trained families
    assert 1 <= first["val/turns_mean"] <= 2 and 0 <= first["val/invalid_actions_mean"] <= 2
    assert {"val/timeout_fraction", "val/out_of_turns_fraction", "val/error_fraction"} <= first.keys()
    episodes = [json.loads(line) for line in (run / "trajectories" / "validation_step_0.jsonl").read_text().splitlines()]
    assert len(episodes) == 10 and all(e["task"]["split"] == "heldout" for e in episodes)

    loop_run(split, *recipe, "grpo.max_num_steps=1", config="grpo_terminal_agent_smol.yaml")
    resumed = loop_run(split, *recipe, "grpo.max_num_steps=2",
                       config="grpo_terminal_agent_smol.yaml")
    assert "resumed from runs/grpo_terminal_agent_smol/checkpoints/step_1 (step 1)" in resumed.output, resumed.output
    step_2 = lambda folder: [(e["task"]["name"], e["turns"], e["reward"]) for e in map(json.loads, (   # noqa: E731
        folder / "runs" / "grpo_terminal_agent_smol" / "trajectories" / "train_step_2.jsonl").read_text().splitlines())]
    assert step_2(split) == step_2(straight)   # the same tasks, the same episodes
    a, b = (checkpoint_weights(folder / "runs" / "grpo_terminal_agent_smol", 2) for folder in (straight, split))
    assert all(torch.equal(a[name], b[name]) for name in a)
