"""Checkpoints are complete or absent, and retention keeps what it promises."""

import json

import pytest
import torch

from dockyard.config.schema.checkpointing import CheckpointingConfig
from dockyard.io.checkpoint import POINTER, CheckpointManager, TorchModuleState


def tiny():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (step + 1))
    return model, optimizer, scheduler


def train(model, optimizer, scheduler, steps=1):
    for _ in range(steps):
        optimizer.zero_grad()
        model(torch.ones(2, 4)).sum().backward()
        optimizer.step()
        scheduler.step()


def manager(tmp_path, **overrides):
    return CheckpointManager(CheckpointingConfig(checkpoint_dir=str(tmp_path), **overrides), rank=0)


def test_save_then_load_restores_weights_optimizer_scheduler_and_state(tmp_path):
    model, optimizer, scheduler = tiny()
    train(model, optimizer, scheduler, 3)
    ckpt = manager(tmp_path)
    ckpt.save(3, TorchModuleState(model, optimizer, scheduler), {"loaders": [{"epoch": 1, "offset": 4}], "metrics": {"m": 0.5}})
    assert (tmp_path / POINTER).read_text() == "3\n"
    expected = [p.detach().clone() for p in model.parameters()]

    fresh_model, fresh_opt, fresh_sched = tiny()
    state = manager(tmp_path).load(manager(tmp_path).latest(), TorchModuleState(fresh_model, fresh_opt, fresh_sched))
    assert state["step"] == 3 and state["loaders"] == [{"epoch": 1, "offset": 4}]
    assert all(torch.equal(a, b) for a, b in zip(fresh_model.parameters(), expected))
    assert fresh_sched.last_epoch == 3
    # the restored optimizer continues exactly like the original did
    reference_model, reference_opt, reference_sched = tiny()
    train(reference_model, reference_opt, reference_sched, 5)
    train(fresh_model, fresh_opt, fresh_sched, 2)
    assert all(torch.equal(a, b) for a, b in zip(fresh_model.parameters(), reference_model.parameters()))


def test_an_interrupted_save_leaves_the_previous_checkpoint_current(tmp_path):
    model, optimizer, scheduler = tiny()
    ckpt = manager(tmp_path)
    ckpt.save(2, TorchModuleState(model, optimizer, scheduler), {"metrics": {}})
    # what a save killed half-way leaves behind: a temporary folder and a temporary pointer
    (tmp_path / "step_4.tmp" / "dcp").mkdir(parents=True)
    (tmp_path / "step_4.tmp" / "dcp" / "partial").write_bytes(b"\0" * 10)
    (tmp_path / (POINTER + ".tmp")).write_text("4\n")
    assert ckpt.latest() == tmp_path / "step_2"
    ckpt.save(4, TorchModuleState(model, optimizer, scheduler), {"metrics": {}})
    assert ckpt.latest() == tmp_path / "step_4" and not (tmp_path / "step_4.tmp").exists()


def test_pointer_to_an_incomplete_checkpoint_is_an_error_not_a_silent_restart(tmp_path):
    (tmp_path / "step_9").mkdir()
    (tmp_path / POINTER).write_text("9\n")
    with pytest.raises(FileNotFoundError, match="names step 9, but .* is not a complete checkpoint"):
        manager(tmp_path).latest()


def test_resume_from_none_and_from_a_path(tmp_path):
    assert manager(tmp_path, resume_from=None).latest() is None
    with pytest.raises(FileNotFoundError, match="resume_from"):
        manager(tmp_path, resume_from=str(tmp_path / "nowhere")).latest()


def test_keep_last_and_keep_top_k(tmp_path):
    model, optimizer, scheduler = tiny()
    ckpt = manager(tmp_path, keep_last=1, keep_top_k=2, metric_name="val")
    for step, val in [(1, 0.9), (2, 0.1), (3, 0.5), (4, 0.2), (5, 0.3)]:
        ckpt.save(step, TorchModuleState(model, optimizer, scheduler), {"metrics": {"val": val}})
    kept = sorted(int(p.name.split("_")[1]) for p in tmp_path.glob("step_*"))
    assert kept == [1, 3, 5]  # best two by val (1, 3) plus the newest
    state = json.loads((tmp_path / "step_5" / "trainer_state.json").read_text())
    assert state["metrics"]["val"] == 0.3


def test_keep_everything(tmp_path):
    model, optimizer, scheduler = tiny()
    ckpt = manager(tmp_path, keep_last=0)
    for step in range(1, 4):
        ckpt.save(step, TorchModuleState(model, optimizer, scheduler), {"metrics": {}})
    assert len(list(tmp_path.glob("step_*"))) == 3
