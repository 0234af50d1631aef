"""What image inputs cost the trainer (docs/parallelism.md, "Vision-language policies"): the tiny random
Idefics3 (models/tiny-vlm, tools/install.sh) on samples shaped like a screenshot agent's.

    .venv/bin/python bench/vision_inputs.py [--model models/tiny-vlm] [--repeats 5]

Prints: the processor's expansion and pixel values of one 1920x1080 screenshot (first time, and from the
trainer's per-image cache); the policy's logprobs of a batch of 4 samples of ~600 tokens with 0, 1 and 3
screenshots each; one training step on the same batch. Figures are medians over --repeats.
"""

from __future__ import annotations

import argparse
import io
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
from PIL import Image  # noqa: E402


def screenshot(seed: int) -> bytes:
    generator = torch.Generator().manual_seed(seed)
    pixels = torch.randint(0, 256, (1080 // 8, 1920 // 8, 3), generator=generator, dtype=torch.uint8).numpy()
    buffer = io.BytesIO()
    Image.fromarray(pixels).resize((1920, 1080), Image.NEAREST).save(buffer, "PNG")
    return buffer.getvalue()


def median_seconds(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="models/tiny-vlm")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    import torch.distributed as dist

    from dockyard import registry
    from dockyard.config import load_config
    from dockyard.distributed import WorldInfo, free_port
    from dockyard.policy.dtensor import DTensorPolicy
    from dockyard.policy.samples import Sample
    from dockyard.vision import VisionInputs

    model = Path(args.model).resolve()
    vision = VisionInputs(model)
    shots = [screenshot(seed) for seed in range(3 + args.repeats)]
    token = vision.image_token_id
    first = median_seconds(lambda: vision.expansion(shots.pop()), args.repeats)
    cached = median_seconds(lambda: vision.expansion(shots[0]), args.repeats)
    print(f"screenshot 1920x1080 -> placeholder expansion + pixel values: {first * 1000:.1f} ms "
          f"(cached: {cached * 1e6:.0f} us)")

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    cfg = load_config("grpo_tiny.yaml", [f"models_dir={model.parent}", f"policy.model_name={model}",
                                         "policy.train_micro_batch_size=4"]).config
    policy = DTensorPolicy(cfg, WorldInfo(0, 1, 0), torch.device("cpu"), total_optimizer_steps=100)
    loss = registry.build("loss", cfg.loss_fn.name, config=cfg.loss_fn)
    for images in (0, 1, 3):
        samples = []
        for row in range(4):
            ids = [5 + (i % 300) for i in range(200)]
            for _ in range(images):
                ids += [token] + [7] * 100
            ids += [9] * (600 - len(ids))
            samples.append(Sample(ids, 400, advantage=1.0 if row % 2 else -1.0, images=shots[:images] or None))
        logprobs = median_seconds(lambda: policy.logprobs(samples), args.repeats)
        step = median_seconds(lambda: policy.train_mini_batch(samples, None, None, loss), args.repeats)
        print(f"4 samples x 600 tokens, {images} screenshot(s) each: logprobs {logprobs * 1000:.0f} ms, "
              f"train step {step * 1000:.0f} ms")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
