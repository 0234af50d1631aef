"""Inputs that change after the preflight passed (a requeued job restarts hours after its submit): a
trainer rank and a generation server that meet a corrupted model folder, a truncated safetensors
file or a deleted dataset end with a named error, no traceback, and leave the checkpoints as they were."""

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dockyard.distributed import free_port
from tests.run.test_local_run import run


def _digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def saved_run(tiny_model, tmp_path_factory):
    """A 2-step run with its checkpoint, the resolved config its ranks read, and its own model copy."""
    import shutil

    workdir = tmp_path_factory.mktemp("saved")
    model = Path(shutil.copytree(tiny_model, workdir / "models" / "tiny-llama"))
    data = workdir / "train.jsonl"
    data.write_text("".join(json.dumps({"input": f"{a}+{a}", "label": str(2 * a)}) + "\n" for a in range(16)))
    result = run(workdir, model, "grpo.max_num_steps=2", "~data.datasets.0.generator", f"data.datasets.0.path={data}")
    assert result.returncode == 0, result.stdout[-3000:]
    return workdir, model, data


def _start_rank(workdir: Path) -> subprocess.CompletedProcess:
    """Rank 0 as `dockyard run` and the Slurm job start it: after the preflight, from the resolved config."""
    env = dict(os.environ, RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(free_port()), DOCKYARD_CONFIG=str(workdir / "runs/grpo_tiny/logs/config.yaml"),
               DOCKYARD_REPLICAS="[]")
    return subprocess.run([sys.executable, "-m", "dockyard.loop"], env=env, cwd=workdir, capture_output=True,
                          text=True, timeout=300)


def _broken(path: Path, change):
    original = path.read_bytes()
    change(path, original)
    return original


TRUNCATE = lambda path, data: path.write_bytes(data[:len(data) // 2])   # noqa: E731
NOT_JSON = lambda path, data: path.write_text("{")                         # noqa: E731
DELETE = lambda path, data: path.unlink()                                   # noqa: E731


@pytest.mark.parametrize("target,change,expected", [
    ("model/model.safetensors", TRUNCATE, "dockyard: model error: {model}/model.safetensors: truncated"),
    ("model/config.json", NOT_JSON, "dockyard: model error: {model}/config.json: not valid JSON"),
    ("data", DELETE, "dockyard: data error: dataset file not found: {data}"),
], ids=["truncated safetensors", "config.json not JSON", "dataset deleted"])
def test_a_trainer_rank_names_the_input_and_leaves_the_checkpoints(saved_run, target, change, expected):
    workdir, model, data = saved_run
    path = data if target == "data" else model / target.split("/", 1)[1]
    checkpoints = workdir / "runs" / "grpo_tiny" / "checkpoints"
    before = _digest(checkpoints)
    original = _broken(path, change)
    try:
        result = _start_rank(workdir)
    finally:
        path.write_bytes(original)
    assert result.returncode == 2, result.stderr[-3000:]
    assert expected.format(model=model, data=data) in result.stderr, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    assert _digest(checkpoints) == before


def test_a_generation_server_names_the_truncated_weights(saved_run):
    workdir, model, _ = saved_run
    weights = model / "model.safetensors"
    original = _broken(weights, TRUNCATE)
    try:
        result = subprocess.run([sys.executable, "-m", "dockyard.generation.server", "--model", str(model),
                                 "--port", "0"], capture_output=True, text=True, timeout=300)
    finally:
        weights.write_bytes(original)
    assert result.returncode == 2, result.stderr[-3000:]
    assert f"dockyard engine: model error: {weights}: truncated" in result.stderr
    assert "Traceback" not in result.stderr
