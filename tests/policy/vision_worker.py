"""One trainer rank of the vision-language data-parallel test (tests/policy/test_vision_policy.py): the
samples of a mini-batch dealt over the world (a one-rank world takes both), rank 0 with the image
sample, rank 1 with the text-only one; one training step; rank 0 writes the serving weights before
and after it to OUT.

    python tests/policy/vision_worker.py --model DIR --out FILE
"""

import argparse
import io

import torch
from PIL import Image

from dockyard import registry
from dockyard.config import load_config
from dockyard.distributed import init_trainer_world
from dockyard.policy.dtensor import DTensorPolicy
from dockyard.policy.samples import Sample
from dockyard.vision import VisionInputs


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    world = init_trainer_world(torch.device("cpu"), timeout_s=120)
    cfg = load_config("grpo_tiny.yaml", [f"models_dir={args.model}/..", f"policy.model_name={args.model}"]).config
    torch.manual_seed(0)
    policy = DTensorPolicy(cfg, world, torch.device("cpu"), total_optimizer_steps=1)
    buffer = io.BytesIO()
    Image.new("RGB", (60, 40), (200, 30, 30)).save(buffer, "PNG")
    placeholder = VisionInputs(args.model).image_token_id
    samples = [Sample([3, 4, placeholder, 5, 6, 7, 8], 3, advantage=1.0, images=[buffer.getvalue()]),
               Sample([3, 4, 5, 6, 7, 8, 9], 3, advantage=-1.0)]
    mine = samples if world.world_size == 1 else [samples[world.rank]]
    before = {name: tensor.clone() for name, tensor in policy.serving_weights(torch.float32).items()}
    policy.train_mini_batch(mine, None, None, registry.build("loss", "clipped_pg", config=cfg.loss_fn))
    after = policy.serving_weights(torch.float32)
    if world.is_main:
        torch.save({"before": before, "after": after}, args.out)


if __name__ == "__main__":
    main()
