"""Presets whose rewards come from sandboxes, on the real local Slurm cluster: dockyard-submit places
the trainer (whose rank 0 runs the sandboxes: the terminal agent's episodes, the swe patches' tests)
and the engine on two het components."""

import json
import os
import subprocess
import sys

import pytest

from dockyard.sandboxes.bubblewrap import bwrap_path
from tests.conftest import REPO
from tests.launch.test_submit_on_cluster import job_id_of, sacct_nodes

PRESETS = {
    "grpo_terminal_bench_local": (f"data.datasets.0.path={REPO / 'tasks' / 'terminal_bench' / 'tasks.jsonl'}",
                                  "grpo.max_rollout_turns=2", "policy.max_total_sequence_length=512"),
    "grpo_swe_local": (f"data.datasets.0.path={REPO / 'tasks' / 'swe' / 'swe_bench.jsonl'}",
                       "grpo.filters.identical_reward=false"),   # its prompts need the preset's 1024 tokens
}


@pytest.mark.skipif(bwrap_path() is None, reason="bubblewrap is not installed (tools/install.sh)")
@pytest.mark.parametrize("preset", list(PRESETS))
def test_a_sandboxed_preset_runs_as_a_het_job(slurm_cluster, tmp_path, tiny_model, preset):
    argv = [sys.executable, "-c", "import sys; from dockyard.cli import submit_main; sys.exit(submit_main())",
            "--config", f"{preset}.yaml", "--nodes", "2", "--wait",
            f"models_dir={tiny_model.parent}", f"policy.model_name={tiny_model}", *PRESETS[preset],
            "cluster.num_nodes=2", "cluster.colocate=false", "cluster.trainer.num_nodes=1", "cluster.rollout.num_nodes=1",
            f"cluster.slurm.folder={tmp_path}/slurm",
            "policy.generation.max_new_tokens=24", "grpo.max_num_steps=2", "checkpointing.enabled=false",
            "grpo.num_prompts_per_step=2", "grpo.num_generations_per_prompt=2", "policy.train_global_batch_size=4",
            "policy.dynamic_batching.enabled=false"]
    result = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=600,
                            env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert result.returncode == 0, result.stdout + result.stderr
    job = job_id_of(result.stdout)
    assert "COMPLETED" in result.stderr
    nodes = sacct_nodes(job)
    assert nodes[f"{job}+0"] != nodes[f"{job}+1"]
    run = tmp_path / "runs" / preset
    assert [json.loads(line)["step"] for line in (run / "logs" / "metrics.jsonl").read_text().splitlines()] == [1, 2]
    for step in (1, 2):
        records = [json.loads(line) for line in (run / "trajectories" / f"train_step_{step}.jsonl").read_text().splitlines()]
        assert len(records) == 4 and all(r["error"] is None for r in records)
        if preset == "grpo_terminal_bench_local":
            assert all("tests" in r["sandbox_events"][-1] for r in records)
        else:   # every patch was scored (the tiny model's replies hold none: the invalid-action penalty)
            assert all(r["status"] == "ok" and r["reward"] == -0.1 for r in records)
