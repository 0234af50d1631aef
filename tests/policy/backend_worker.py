"""One trainer rank for the backend contract and parity tests (tests/policy/test_policy_backends.py):
builds the policy of --backend over the world in RANK / WORLD_SIZE through the Policy interface
only, and writes (rank 0) to OUT: the logprobs before training, each step's figures, the logprobs
after, the serving weights, and the logprobs of a fresh policy that resumed from the checkpoint
saved after step 1 and trained step 2 again (exact resume), and of a reference loaded from it.

    python tests/policy/backend_worker.py --backend megatron|dtensor|jax --model DIR --out FILE [--tp 2] [--set K=V ...]
        [--sft plain|packed]

--sft trains SFT's next-token loss on conversations (a shared first token, assistant turns masked in),
packed into shared rows (sft.packing) or one per row.
"""

import argparse
import os
from pathlib import Path

import torch
import torch.distributed as dist

from dockyard import registry
from dockyard.config import load_config
from dockyard.distributed import init_trainer_world
from dockyard.io.checkpoint import CheckpointManager
from dockyard.policy.samples import Sample
from tests.policy.parallel_worker import fixed_samples


def conversations(vocab: int) -> list[Sample]:
    """Eight conversations of different lengths that start with the same token (a chat template's), each
    with two trained stretches (assistant turns) among untrained ones."""
    generator = torch.Generator().manual_seed(11)
    samples = []
    for length in (9, 14, 11, 20, 7, 16, 12, 10):
        ids = [1] + torch.randint(3, vocab, (length - 1,), generator=generator).tolist()
        mask = [int(length // 4 <= i < length // 2 or i >= 3 * length // 4) for i in range(1, length)]
        samples.append(Sample(token_ids=ids, prompt_length=1, loss_mask=mask))
    return samples


def load_elsewhere(args, world, cfg, build) -> None:
    """Writes the reference's logprobs from the step, and what resuming from it said."""
    from dockyard.io.checkpoint import CheckpointLoadError

    reference = build(trainable=False)
    reference.load_weights(args.load)
    logprobs = reference.logprobs(fixed_samples(512))
    try:
        CheckpointManager(cfg.checkpointing, world.rank).load(Path(args.load), build().checkpoint_state())
        resumed = "resumed"
    except CheckpointLoadError as err:
        resumed = str(err)
    truncated = None
    if args.truncated:
        try:
            build(trainable=False).load_weights(args.truncated)
            truncated = "loaded"
        except CheckpointLoadError as err:
            truncated = str(err)
    if world.is_main:
        torch.save({"reference": logprobs, "resumed": resumed, "truncated": truncated}, args.out)
    dist.barrier()
    dist.destroy_process_group()
    os._exit(0)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--pp", type=int, default=1, help="megatron: pipeline stages")
    parser.add_argument("--set", action="append", default=[])
    parser.add_argument("--load", help="instead: a step saved by another layout, loaded as a reference and resumed")
    parser.add_argument("--truncated", help="with --load: a copy of a step with a cut checkpoint file, loaded too")
    parser.add_argument("--sft", choices=("plain", "packed"), help="SFT's loss on conversations, packed or not")
    args = parser.parse_args()
    torch.set_num_threads(1)
    world = init_trainer_world(torch.device("cpu"), timeout_s=120, model_parallel_size=args.tp * args.pp)
    overrides = [f"policy.model_name={args.model}", f"policy.backend={args.backend}",
                 f"cluster.cpu_ranks_per_node={world.world_size}", "policy.train_micro_batch_size=2",
                 "loss_fn.entropy_coef=0.01", "policy.max_grad_norm=0.05", "policy.optimizer.lr=1e-3", *args.set]
    if args.backend == "megatron":
        overrides += [f"+policy.megatron_cfg.tensor_model_parallel_size={args.tp}",
                      f"+policy.megatron_cfg.pipeline_model_parallel_size={args.pp}"]
    cfg = load_config("grpo_tiny.yaml", overrides).config
    folder = args.out + ".checkpoints"   # the same on every rank
    cfg = cfg.model_copy(update={"checkpointing": cfg.checkpointing.model_copy(update={"checkpoint_dir": folder,
                                                                                      "export_hf": True})})

    def build(trainable=True):
        policy = registry.build("policy_backend", args.backend, config=cfg, world=world, device=torch.device("cpu"),
                                total_optimizer_steps=4, trainable=trainable)
        if args.sft:
            policy.score_data(packed=args.sft == "packed")
        return policy

    if args.load:
        load_elsewhere(args, world, cfg, build)
        return
    policy = build()
    loss = registry.build("loss", cfg.loss_fn.name, config=cfg.loss_fn)
    samples = fixed_samples(512)
    if args.sft:
        from dockyard.loop.sft import NextTokenLoss

        loss, samples = NextTokenLoss(), conversations(512)
    local = samples[world.data_rank::world.data_size]
    before = policy.logprobs(samples)
    manager = CheckpointManager(cfg.checkpointing, world.rank, hf_source=args.model)
    steps = [policy.train_mini_batch(local, None, None, loss)]
    saved = manager.save(1, policy.checkpoint_state(), {})
    after_one = policy.logprobs(samples)
    steps.append(policy.train_mini_batch(local, None, None, loss))
    after = policy.logprobs(samples)
    serving = policy.serving_weights(torch.float32)
    resumed = build()
    manager.load(saved, resumed.checkpoint_state())
    again = resumed.train_mini_batch(local, None, None, loss)
    resumed_after = resumed.logprobs(samples)
    reference = build(trainable=False)
    reference.load_weights(saved)
    reference_logprobs = reference.logprobs(samples)
    # jax: how the mesh split one column-parallel and one row-parallel weight (shapes per device)
    shards = {name: sorted(tuple(s.data.shape) for s in policy.params[name].addressable_shards)
              for name in ("model.layers.0.mlp.up_proj.weight", "model.layers.0.self_attn.o_proj.weight")} \
        if args.backend == "jax" else None
    # megatron: how many rows the samples took (packed conversations share rows)
    rows = policy._layout(samples).ids.shape[0] if args.backend == "megatron" else None
    if world.is_main:
        torch.save({"rows": rows, "before": before, "steps": steps, "after": after, "serving": serving, "again": again, "after_one": after_one,
                    "resumed_after": resumed_after, "reference": reference_logprobs,
                    "hf_export": str(saved / "hf"), "shards": shards}, args.out)
    dist.barrier()
    dist.destroy_process_group()
    os._exit(0)


if __name__ == "__main__":
    main()
