"""One trainer rank for the parallelism tests (tests/policy/test_tensor_parallel.py): for each model,
builds the dtensor policy with the given TP or CP size over the world in RANK / WORLD_SIZE, trains a fixed
set of samples for a few optimizer steps and writes (rank 0) the logprobs, entropies, losses, full
weights and full optimizer state it ended with to OUT/<model folder name>.pt.

    python tests/policy/parallel_worker.py --model DIR[:shared] ... [--tp 2 | --cp 2] --out OUT [--steps 3]
        [--save CKPT] [--load CKPT] [--set KEY=VALUE ...]

`:shared` turns on shared-prompt rows; --set adds a config override; --save writes a DCP checkpoint of the last model after its
steps, --load reads one into it before.
"""

import argparse
import os

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

from dockyard import registry
from dockyard.config import load_config
from dockyard.distributed import init_trainer_world
from dockyard.io.checkpoint import CheckpointManager
from dockyard.policy.samples import Sample


def fixed_samples(vocab: int) -> list[Sample]:
    """Four prompts with two responses each, of different lengths (ids and advantages from a fixed seed)."""
    generator = torch.Generator().manual_seed(7)
    samples = []
    for prompt_length in (5, 9, 6, 12):
        prompt = torch.randint(3, vocab, (prompt_length,), generator=generator).tolist()
        for response_length in (4, 7):
            response = torch.randint(3, vocab, (response_length,), generator=generator).tolist()
            samples.append(Sample(token_ids=prompt + response, prompt_length=prompt_length,
                                  advantage=float(torch.randn((), generator=generator))))
    return samples


def run_model(model: str, shared: bool, args, world, last: bool) -> None:
    ranks_per_node = world.world_size // 2 if world.world_size > 1 else 1
    overrides = [f"policy.model_name={model}", f"policy.dtensor_cfg.tensor_parallel_size={args.tp}",
                 f"policy.dtensor_cfg.context_parallel_size={args.cp}",
                 f"cluster.cpu_ranks_per_node={ranks_per_node}", "policy.train_micro_batch_size=2",
                 "loss_fn.entropy_coef=0.01", "policy.max_grad_norm=0.05", *args.set]
    if shared:
        overrides += ["policy.dynamic_batching.enabled=true", "policy.dynamic_batching.share_prompts=true",
                      "policy.dynamic_batching.max_tokens_per_gpu=64", "policy.max_total_sequence_length=64"]
    cfg = load_config("grpo_tiny.yaml", overrides).config
    torch.manual_seed(0)
    policy = registry.build("policy_backend", "dtensor", config=cfg, world=world, device=torch.device("cpu"),
                            total_optimizer_steps=3)
    save = args.save if last else None
    checkpoints = CheckpointManager(cfg.checkpointing.model_copy(update={"checkpoint_dir": save or args.load}),
                                    world.rank, hf_source=model) if (save or args.load) else None
    if args.load:
        checkpoints.load(checkpoints.latest(), policy.checkpoint_state())
    start = {name: tensor.clone() for name, tensor in policy.full_state_dict().items()}
    loss = registry.build("loss", cfg.loss_fn.name, config=cfg.loss_fn)
    samples = fixed_samples(policy.model.config.vocab_size)
    local = samples[world.data_rank::world.data_size]
    steps = [policy.train_mini_batch(local, None, None, loss) for _ in range(args.steps)]
    if save:
        checkpoints.save(args.steps, policy.checkpoint_state(), {})
    logprobs = policy.logprobs(samples)
    with torch.no_grad():
        _, entropy = policy._forward_logprobs(samples, with_entropy=True)
    weights = policy.full_state_dict()
    optimizer = get_optimizer_state_dict(policy.model, policy.optimizer,
                                         options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if world.is_main:
        moments = {name: state["exp_avg"].clone() for name, state in optimizer["state"].items()}
        moved = max(float((weights[name] - start[name]).abs().max()) for name in weights)
        torch.save({"steps": steps, "logprobs": logprobs, "entropy": entropy, "exp_avg": moments, "moved": moved,
                    "weights": {name: tensor.clone() for name, tensor in weights.items()}},
                   os.path.join(args.out, os.path.basename(model.rstrip("/")) + ".pt"))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", action="append", required=True)
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--cp", type=int, default=1)
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--set", action="append", default=[])
    parser.add_argument("--save")
    parser.add_argument("--load")
    args = parser.parse_args()
    torch.set_num_threads(1)
    world = init_trainer_world(torch.device("cpu"), timeout_s=120, model_parallel_size=args.tp * args.cp)
    for index, spec in enumerate(args.model):
        model, _, flag = spec.partition(":")
        run_model(model, flag == "shared", args, world, last=index == len(args.model) - 1)
    dist.destroy_process_group()
    os._exit(0)


if __name__ == "__main__":
    main()
