"""The terminal-agent recipe from nothing: generate the task splits, make the SFT demonstrations, SFT,
GRPO, and evaluate the base, SFT and GRPO models on the held-out split (new instances of the trained
families) and the unseen families, greedy, one episode per task.

    python bench/terminal_agent.py [--keep DIR] [--grpo-steps N] [--sft-steps N] [--skip-base]

Ends with one line:
    held-out: base X%, sft Y%, grpo Z%; unseen families: base A%, sft B%, grpo C%; N min
and writes learning_curve.png (held-out success against GRPO steps and wall time) and every
evaluation episode under <folder>/runs/eval/<model>-<split>/ (trajectory dumps).
Targets on a 2-core CPU with SmolLM2-135M-Instruct, 60 minutes at most: held-out >= 50%, GRPO >= SFT + 10.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def dockyard(folder: Path, *args: str) -> None:
    started = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "dockyard.cli", *args], cwd=folder, capture_output=True, text=True)
    if result.returncode != 0:
        print(result.stdout[-3000:], result.stderr[-5000:], file=sys.stderr)
        sys.exit(f"dockyard {' '.join(args[:2])} failed ({result.returncode})")
    print(f"  dockyard {' '.join(args[:3])}: {time.perf_counter() - started:.0f} s", flush=True)


@contextlib.contextmanager
def engine(model: Path, log: Path):
    from dockyard.distributed import free_port
    from dockyard.generation.client import EngineClient

    port = free_port()
    with open(log, "w") as handle:
        process = subprocess.Popen([sys.executable, "-m", "dockyard.generation.server", "--model", str(model),
                                    "--port", str(port), "--threads", "1"], stdout=handle, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        EngineClient(url, log_path=log).wait_healthy(300, process)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=60)


def evaluate(folder: Path, label: str, model: Path, split: str, *overrides: str) -> dict[str, float]:
    """The GRPO config's validation (the same episodes, greedy) of `model` on `split`, in this process."""
    import torch

    from dockyard.config import load_config
    from dockyard.distributed import WorldInfo
    from dockyard.loop.grpo import GRPOTrainer

    started = time.perf_counter()
    out = folder / "runs" / "eval" / f"{label}-{split}"
    out.mkdir(parents=True, exist_ok=True)
    cfg = load_config("grpo_terminal_agent_smol.yaml", [
        f"models_dir={REPO / 'models'}", f"data_dir={folder / 'data'}", f"runs_dir={folder / 'runs'}",
        f"policy.model_name={model}", f"data.validation.path={folder / 'data' / 'terminal_families' / f'{split}.jsonl'}",
        f"env.dump_trajectory_path={out}", f"logger.log_dir={out}", *overrides]).config
    with engine(model, out / "engine.log") as url:
        torch.manual_seed(cfg.policy.seed)
        trainer = GRPOTrainer(cfg, WorldInfo(0, 1, 0), torch.device("cpu"),
                              [{"name": "generation server (embedded)", "url": url, "log": str(out / "engine.log")}], 0)
        figures = trainer.validate(0)
    print(f"  evaluate {label} on {split}: {figures['val/accuracy']:.0%} ({time.perf_counter() - started:.0f} s)",
          flush=True)
    (out / "figures.json").write_text(json.dumps(figures, indent=2))
    return figures


def curve(folder: Path, rows: list[dict], results: dict[str, dict[str, float]]) -> Path:
    """Held-out success during GRPO (its validations; step 0 is the SFT model's evaluation) and the
    unseen families before and after GRPO, against steps and wall time."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    heldout = [(0, 0.0, results["sft-heldout"]["val/accuracy"])]
    wall = 0.0
    for row in rows:
        wall += row.get("time/step", 0.0)
        if row["step"] > 0 and "val/accuracy" in row:
            heldout.append((row["step"], wall / 60, row["val/accuracy"]))
    unseen = [(0, 0.0, results["sft-unseen"]["val/accuracy"]),
              (rows[-1]["step"], wall / 60, results["grpo-unseen"]["val/accuracy"])]
    figure, (by_step, by_time) = plt.subplots(1, 2, figsize=(10, 4))
    for axis, index, label in ((by_step, 0, "GRPO step"), (by_time, 1, "GRPO wall time (min)")):
        for points, name in ((heldout, "held-out (new instances)"), (unseen, "unseen families")):
            axis.plot([p[index] for p in points], [100 * p[2] for p in points], marker="o", label=name)
        axis.set_xlabel(label)
        axis.set_ylabel("success (%)")
        axis.set_ylim(0, 100)
        axis.grid(alpha=0.3)
        axis.legend()
    figure.suptitle("SmolLM2-135M terminal agent: success during GRPO (step 0: the SFT checkpoint)")
    path = folder / "learning_curve.png"
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", help="work in this folder and keep it (default: a temporary folder)")
    parser.add_argument("--grpo-steps", type=int, help="default: the GRPO config's grpo.max_num_steps")
    parser.add_argument("--sft-steps", type=int, help="default: the SFT config's sft.max_num_steps")
    parser.add_argument("--train", type=int, default=40, help="train tasks per family (env generate --train)")
    parser.add_argument("--skip-base", action="store_true", help="do not evaluate the base model")
    args = parser.parse_args()
    folder = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="dockyard-terminal-agent-"))
    folder.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    common = [f"models_dir={REPO / 'models'}", f"data_dir={folder / 'data'}", f"runs_dir={folder / 'runs'}"]
    families = folder / "data" / "terminal_families"

    import torch.distributed as dist

    from dockyard.distributed import free_port

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1,
                            timeout=timedelta(minutes=30))
    print("1. task splits", flush=True)
    dockyard(folder, "env", "generate", "--out", str(families), "--train", str(args.train))
    print("2. demonstrations", flush=True)
    dockyard(folder, "env", "demonstrate", "--config", "grpo_terminal_agent_smol", "--tasks",
             str(families / "train.jsonl"), "--out", str(families / "sft.jsonl"), *common)
    print("3. SFT", flush=True)
    dockyard(folder, "run", "--config", "sft_terminal_agent_smol", *common,
             *([f"sft.max_num_steps={args.sft_steps}"] if args.sft_steps else []))
    base, sft = REPO / "models" / "smollm2-135m-instruct", folder / "runs" / "sft_terminal_agent_smol" / "checkpoints" / "hf"
    results: dict[str, dict[str, float]] = {}
    for label, model in ([] if args.skip_base else [("base", base)]) + [("sft", sft)]:
        for split in ("heldout", "unseen"):
            results[f"{label}-{split}"] = evaluate(folder, label, model, split)
    print("4. GRPO", flush=True)
    # the SFT model's held-out figure is step 0 of the curve already: no validation at the start
    dockyard(folder, "run", "--config", "grpo_terminal_agent_smol", "grpo.val_at_start=false",
             "checkpointing.export_hf=true", *common, *([f"grpo.max_num_steps={args.grpo_steps}"] if args.grpo_steps else []))
    rows = [json.loads(line) for line in
            (folder / "runs" / "grpo_terminal_agent_smol" / "logs" / "metrics.jsonl").read_text().splitlines()]
    grpo = folder / "runs" / "grpo_terminal_agent_smol" / "checkpoints" / "hf"
    for split in ("heldout", "unseen"):
        results[f"grpo-{split}"] = evaluate(folder, "grpo", grpo, split)
    picture = curve(folder, rows, results)
    dist.destroy_process_group()

    def pct(key: str) -> str:
        return f"{results[key]['val/accuracy']:.0%}" if key in results else "-"

    labels = [label for label in ("base", "sft", "grpo") if f"{label}-heldout" in results]
    print(f"{'family (split)':28}" + "".join(f"{label:>7}" for label in labels))
    for split in ("heldout", "unseen"):
        for key in sorted(k for k in results[f"sft-{split}"] if k.startswith("val/accuracy/")):
            print(f"{key.split('/')[-1] + f' ({split})':28}" +
                  "".join(f"{results[f'{label}-{split}'].get(key, 0.0):>7.0%}" for label in labels))
        for key in ("val/turns_mean", "val/invalid_actions_mean"):
            print(f"{key.split('/')[-1] + f' ({split})':28}" +
                  "".join(f"{results[f'{label}-{split}'][key]:>7.2f}" for label in labels))
    print(f"learning curve: {picture}; episodes: {folder / 'runs' / 'eval'}")
    print(f"held-out: base {pct('base-heldout')}, sft {pct('sft-heldout')}, grpo {pct('grpo-heldout')}; "
          f"unseen families: base {pct('base-unseen')}, sft {pct('sft-unseen')}, grpo {pct('grpo-unseen')}; "
          f"{(time.perf_counter() - started) / 60:.0f} min")
    return 0


if __name__ == "__main__":
    sys.exit(main())
