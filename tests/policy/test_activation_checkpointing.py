"""policy.dtensor_cfg.activation_checkpointing recomputes the decoder layers' activations in backward
of the policy's own training step: the same gradients, and far fewer bytes kept for backward
(measured with autograd's saved-tensor hooks)."""

import torch

from dockyard.config import load_config
from dockyard import registry
from dockyard.policy.samples import Sample
from dockyard.policy.dtensor import DTensorPolicy


def gradients_and_saved_bytes(world, tiny_model, checkpointing: bool):
    cfg = load_config("grpo_tiny.yaml", [f"models_dir={tiny_model.parent}",
                                         f"policy.dtensor_cfg.activation_checkpointing={str(checkpointing).lower()}"]
                      ).config
    torch.manual_seed(0)
    policy = DTensorPolicy(cfg, world, torch.device("cpu"), total_optimizer_steps=1)
    loss = registry.build("loss", cfg.loss_fn.name, config=cfg.loss_fn)
    generator = torch.Generator().manual_seed(0)
    samples = [Sample(token_ids=torch.randint(3, 500, (96,), generator=generator).tolist(), prompt_length=16,
                      advantage=advantage) for advantage in (1.0, -0.5, 0.25, -1.0)]
    saved = []

    def pack(tensor):
        saved.append(tensor.numel() * tensor.element_size())
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        policy.train_mini_batch(samples, None, None, loss)
    assert not policy.model.training   # back in eval mode for logprobs
    grads = {name: p.grad.full_tensor().clone() for name, p in policy.model.named_parameters()}
    return grads, sum(saved)


def test_checkpointing_gives_the_same_gradients_and_keeps_fewer_activations(single_rank_world, tiny_model):
    plain, plain_bytes = gradients_and_saved_bytes(single_rank_world, tiny_model, False)
    recomputed, recomputed_bytes = gradients_and_saved_bytes(single_rank_world, tiny_model, True)
    assert plain.keys() == recomputed.keys()
    for name in plain:
        torch.testing.assert_close(recomputed[name], plain[name], rtol=1e-5, atol=1e-6, msg=name)
    print(f"bytes saved for backward: {plain_bytes} without, {recomputed_bytes} with checkpointing")
    assert recomputed_bytes < 0.6 * plain_bytes
