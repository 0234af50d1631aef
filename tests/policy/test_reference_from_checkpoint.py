"""A reference policy from a saved dockyard checkpoint (loss_fn.reference_model.checkpoint_path): it
takes exactly the saved weights; an unusable path is an error naming the field, never a fallback."""

import json

import pytest
import torch
import torch.distributed.checkpoint as dcp

from dockyard import registry
from dockyard.config import load_config
from dockyard.io.checkpoint import CheckpointLoadError, CheckpointManager, load_model_weights
from dockyard.preflight import model_problems
from dockyard.policy.samples import Sample


def test_the_reference_takes_the_weights_of_the_saved_step(single_rank_world, tiny_model, tmp_path):
    cfg = load_config("grpo_tiny.yaml", [f"models_dir={tiny_model.parent}",
                                         f"checkpointing.checkpoint_dir={tmp_path}/ckpt"]).config
    build = dict(config=cfg, world=single_rank_world, device=torch.device("cpu"))
    policy = registry.build("policy_backend", "dtensor", total_optimizer_steps=4, **build)
    loss = registry.build("loss", cfg.loss_fn.name, config=cfg.loss_fn)
    samples = [Sample(token_ids=[1, 2, 3, 4, 5], prompt_length=2, advantage=a) for a in (1.0, -1.0)]
    policy.train_mini_batch(samples, None, None, loss)
    saved = CheckpointManager(cfg.checkpointing, 0).save(1, policy.checkpoint_state(), {})
    trained = policy.full_state_dict()

    reference = registry.build("policy_backend", "dtensor", total_optimizer_steps=0, trainable=False, **build)
    assert any(not torch.equal(trained[k], v) for k, v in reference.full_state_dict().items())
    load_model_weights(saved, reference.model)
    loaded = reference.full_state_dict()
    assert all(torch.equal(trained[k], loaded[k]) for k in trained)
    assert torch.equal(torch.cat(reference.logprobs(samples)), torch.cat(policy.logprobs(samples)))


def test_a_checkpoint_of_another_model_is_refused_with_the_reason(single_rank_world, tiny_model, tmp_path):
    other = tmp_path / "step_3"
    dcp.save({"model": {"lm_head.weight": torch.zeros(3, 3)}}, checkpoint_id=str(other / "dcp"))
    (other / "trainer_state.json").write_text(json.dumps({"step": 3}))
    cfg = load_config("grpo_tiny.yaml", [f"models_dir={tiny_model.parent}"]).config
    reference = registry.build("policy_backend", "dtensor", config=cfg, world=single_rank_world,
                               device=torch.device("cpu"), total_optimizer_steps=0, trainable=False)
    with pytest.raises(CheckpointLoadError, match="does not hold this model's weights"):
        load_model_weights(other, reference.model)


def reference_problems(tiny_model, path) -> list[str]:
    cfg = load_config("grpo_tiny.yaml", [f"models_dir={tiny_model.parent}", "loss_fn.reference_policy_kl_penalty=0.1",
                                         f"loss_fn.reference_model.checkpoint_path={path}",
                                         "loss_fn.reference_model.hf_path=${policy.model_name}"]).config
    return [str(p) for p in model_problems(cfg)[0]]


def test_unusable_checkpoint_paths_are_named_before_anything_starts(tiny_model, tmp_path):
    field = "loss_fn.reference_model.checkpoint_path: "
    assert reference_problems(tiny_model, tmp_path / "nowhere") == [field + f"no checkpoint folder at {tmp_path}/nowhere"]
    (tmp_path / "run" / "step_2" / "dcp").mkdir(parents=True)
    (tmp_path / "run" / "latest_checkpointed_iteration.txt").write_text("2\n")
    [problem] = reference_problems(tiny_model, tmp_path / "run")
    assert problem.startswith(field) and "is a checkpoint_dir" in problem and "step_<N>" in problem
    [problem] = reference_problems(tiny_model, tmp_path / "run" / "step_2")
    assert problem.startswith(field) and "not a complete dockyard checkpoint" in problem
