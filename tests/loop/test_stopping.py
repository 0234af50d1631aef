"""Stopping early: signal handlers only record, the deadline counts the longest step and save, and a
mini-batch interrupted before its optimizer step leaves weights and optimizer untouched."""

import os
import signal
import pytest
import torch

from dockyard import registry
from dockyard.config import load_config
from dockyard.loop import stopping
from dockyard.loop.stopping import StopRequests


@pytest.fixture
def restore_signals():
    saved = {s: signal.getsignal(s) for s in (signal.SIGUSR2, signal.SIGTERM)}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


def test_signals_are_recorded_and_usr2_outranks_sigterm(restore_signals):
    called = []
    stop = StopRequests(torch.device("cpu"), on_signal=lambda: called.append(True)).install()
    assert stop.agree() == stopping.NONE and not stop.requested
    os.kill(os.getpid(), signal.SIGTERM)
    assert stop.requested and stop.agree() == stopping.TERM
    os.kill(os.getpid(), signal.SIGUSR2)
    assert stop.agree() == stopping.USR2
    assert stopping.RunStopped(stopping.USR2, 3).wants_requeue
    assert not stopping.RunStopped(stopping.TERM, 3).wants_requeue
    assert called


def test_deadline_counts_the_longest_step_and_save_plus_the_margin():
    stop = StopRequests(torch.device("cpu"), deadline=1000.0, margin_s=30)
    stop.note_step(100)
    stop.note_step(40)
    stop.note_save(20)
    assert not stop.deadline_near(now=1000 - 151)
    assert stop.deadline_near(now=1000 - 149)
    assert not StopRequests(torch.device("cpu"), deadline=None).deadline_near(now=1e12)


def test_interrupted_mini_batch_changes_neither_weights_nor_optimizer(single_rank_world, tiny_model):
    from dockyard.policy.samples import Sample, TrainingInterrupted

    cfg = load_config("grpo_tiny.yaml", [f"models_dir={tiny_model.parent}", "policy.train_micro_batch_size=2"]).config
    policy = registry.build("policy_backend", "dtensor", config=cfg, world=single_rank_world,
                            device=torch.device("cpu"), total_optimizer_steps=4)
    loss = registry.build("loss", cfg.loss_fn.name, config=cfg.loss_fn)
    samples = [Sample(token_ids=[1, 2, 3, 4, 5, 6], prompt_length=3, advantage=a) for a in (1.0, -1.0, 0.5, -0.5)]
    before = {k: v.detach().clone() for k, v in policy.full_state_dict().items()}
    calls = []

    def stop_on_second_micro_batch():
        calls.append(1)
        return len(calls) == 2

    with pytest.raises(TrainingInterrupted):
        policy.train_mini_batch(samples, None, None, loss, interrupt=stop_on_second_micro_batch)
    assert len(calls) == 2   # checked before each micro-batch: the first one ran
    after = policy.full_state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert not policy.optimizer.state   # no optimizer step was taken
    assert all(p.grad is None for p in policy.model.parameters())
    # without an interrupt the same mini-batch trains
    policy.train_mini_batch(samples, None, None, loss)
    assert any(not torch.equal(before[k], v) for k, v in policy.full_state_dict().items())
