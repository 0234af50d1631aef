"""A moving reference takes the policy's current weights (both FSDP-sharded, after forwards)."""

import torch

from dockyard import registry
from dockyard.config import load_config
from dockyard.policy.samples import Sample


def test_copy_weights_from_makes_the_reference_equal_to_the_trained_policy(single_rank_world, tiny_model):
    cfg = load_config("grpo_tiny.yaml", [f"models_dir={tiny_model.parent}"]).config
    build = dict(config=cfg, world=single_rank_world, device=torch.device("cpu"))
    policy = registry.build("policy_backend", "dtensor", total_optimizer_steps=4, **build)
    reference = registry.build("policy_backend", "dtensor", total_optimizer_steps=0, trainable=False, **build)
    loss = registry.build("loss", cfg.loss_fn.name, config=cfg.loss_fn)
    samples = [Sample(token_ids=[1, 2, 3, 4, 5], prompt_length=2, advantage=a) for a in (1.0, -1.0)]
    reference.logprobs(samples)           # a no-grad forward first, as in the loop
    policy.train_mini_batch(samples, None, None, loss)
    trained = policy.full_state_dict()
    assert any(not torch.equal(trained[k], v) for k, v in reference.full_state_dict().items())
    reference.copy_weights_from(policy)
    copied = reference.full_state_dict()
    assert all(torch.equal(trained[k], copied[k]) for k in trained)
    assert torch.allclose(torch.cat(reference.logprobs(samples)), torch.cat(policy.logprobs(samples)))
