"""The V4-style recipe on this CPU: two domains that reasoning-gym generates offline, SmolLM2-135M.

    python tools/v4_recipe.py all                 data, the three stages, the comparison run, the table
    python tools/v4_recipe.py data                write the datasets under $DOCKYARD_DATA_DIR (data/)
    python tools/v4_recipe.py stage1|stage2|stage3|mixed
    python tools/v4_recipe.py eval                held-out accuracy per domain of every model built

Stages (each a plain `dockyard run`, each stage's outputs where the next stage's config expects them):

    1  SFT per domain        configs/sft_smol.yaml           DOCKYARD_DOMAIN=<d>  -> runs/sft_<d>/checkpoints/hf
       SFT of the student    configs/sft_smol.yaml           DOCKYARD_DOMAIN=general (both domains)
                                                                                  -> runs/sft_general/checkpoints/hf
    2  GRPO per domain       configs/grpo_domain_smol.yaml   DOCKYARD_DOMAIN=<d>  -> runs/grpo_<d>/checkpoints/hf
       (from its stage-1 model)
    3  consolidation         configs/v4_consolidation_smol.yaml: on-policy distillation of both experts
       into the student (sft_general), each prompt scored by its domain's expert -> runs/v4_consolidation_smol/...

    mixed: one GRPO run on both domains' prompts from the stage-1 models' starting point (SmolLM2),
    given the training time of stages 1-3 together: what the recipe is compared with.

Domains: `arithmetic` (reasoning-gym basic_arithmetic, one-digit, two terms) and `letter_counting`
(how often a letter appears in a short text): different skills, both with numeric answers.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DOMAINS = {
    "arithmetic": {"name": "basic_arithmetic", "min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1,
                   "allow_negation": False, "allow_parentheses": False},
    "letter_counting": {"name": "letter_counting", "min_words": 3, "max_words": 6},
}
AGENTS = {"arithmetic": "calculator", "letter_counting": "letter_counter"}
INSTRUCTION = "Give only the final answer."
SIZES = {"sft": 2000, "sft_val": 64, "prompts": 4000, "heldout": 150}
SEEDS = {"sft": 1, "sft_val": 2, "prompts": 3, "heldout": 12345}


def data_dir() -> Path:
    return Path(os.environ.get("DOCKYARD_DATA_DIR", "data"))


def runs_dir() -> Path:
    return Path(os.environ.get("DOCKYARD_RUNS_DIR", "runs"))


def generated(domain: str, part: str) -> list[dict]:
    """Rows of one domain from reasoning-gym, answers checked as the training datasets check them."""
    from dockyard.config.schema.data import DatasetConfig
    from dockyard.data.datasets import generate_rows

    spec = dict(DOMAINS[domain])
    config = DatasetConfig(name=f"{domain}_{part}", generator={**spec, "size": SIZES[part], "seed": SEEDS[part]})
    return generate_rows(config)


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    print(f"wrote {path} ({len(rows)} rows)")


def make_data() -> None:
    """SFT conversations, GRPO prompts, held-out prompts per domain, and the mixed consolidation prompts.
    Held-out rows come from their own seed; their questions are left out of every training file (one-digit
    arithmetic has a few hundred distinct questions, so the training files repeat the others)."""
    root = data_dir()
    mixed = []
    for domain in DOMAINS:
        chat = lambda row: [{"role": "user", "content": f"{row['input']}\n{INSTRUCTION}"},  # noqa: E731
                            {"role": "assistant", "content": str(row["label"])}]
        heldout = generated(domain, "heldout")
        held = {row["input"] for row in heldout}
        sft, sft_val, prompts = (
            [row for row in generated(domain, part) if row["input"] not in held] for part in ("sft", "sft_val", "prompts"))
        write_jsonl(root / "sft" / f"{domain}.jsonl", [{"messages": chat(r)} for r in sft])
        write_jsonl(root / "sft" / f"{domain}_val.jsonl", [{"messages": chat(r), "label": str(r["label"])}
                                                           for r in sft_val])
        rows = [{"input": r["input"], "label": str(r["label"]), "metadata": {"agent_name": AGENTS[domain]}}
                for r in prompts]
        write_jsonl(root / "prompts" / f"{domain}.jsonl", rows)
        write_jsonl(root / "heldout" / f"{domain}.jsonl",
                    [{"input": r["input"], "label": str(r["label"]), "metadata": {"agent_name": AGENTS[domain]}}
                     for r in heldout])
        mixed += rows
    import random

    general = [json.loads(line) for d in DOMAINS for line in (root / "sft" / f"{d}.jsonl").read_text().splitlines()]
    random.Random(0).shuffle(general)
    write_jsonl(root / "sft" / "general.jsonl", general)
    write_jsonl(root / "sft" / "general_val.jsonl",
                [json.loads(line) for d in DOMAINS for line in (root / "sft" / f"{d}_val.jsonl").read_text()
                 .splitlines()[:SIZES["sft_val"] // len(DOMAINS)]])
    random.Random(0).shuffle(mixed)
    write_jsonl(root / "consolidation" / "prompts.jsonl", mixed)
    write_jsonl(root / "consolidation" / "heldout.jsonl",
                [json.loads(line) for d in DOMAINS for line in (root / "heldout" / f"{d}.jsonl").read_text()
                 .splitlines()[:50]])


SAVE_TIMEOUT_S = 600


def dockyard_run(config: str, env: dict[str, str], *overrides: str, stop_after_s: float | None = None) -> float:
    """One stage; returns its wall time in seconds (the run's own output goes to the terminal). With
    `stop_after_s` the run gets a Ctrl-C when that time is spent, as a user would send it: it saves (and
    exports) at its next safe point and exits."""
    started = time.monotonic()
    command = [sys.executable, "-m", "dockyard.cli", "run", "--config", config, *overrides]
    print("+", " ".join(f"{k}={v}" for k, v in env.items()), " ".join(command[2:]), flush=True)
    process = subprocess.Popen(command, env={**os.environ, **env})
    try:
        code = process.wait(timeout=stop_after_s)
    except subprocess.TimeoutExpired:
        print(f"v4_recipe: {stop_after_s:.0f} s spent; stopping {config} (it saves at its next safe point)", flush=True)
        process.send_signal(signal.SIGINT)
        try:
            code = process.wait(timeout=SAVE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            raise SystemExit(f"v4_recipe: {config} did not save and stop within {SAVE_TIMEOUT_S} s of its Ctrl-C")
        if code == 128 + signal.SIGINT:
            code = 0
    if code != 0:
        raise SystemExit(f"v4_recipe: dockyard run --config {config} exited with status {code}")
    return time.monotonic() - started


def record(stage: str, seconds: float) -> None:
    path = runs_dir() / "v4_recipe_times.json"
    times = json.loads(path.read_text()) if path.is_file() else {}
    times[stage] = seconds
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(times, indent=2))


def stage1(extra: list[str]) -> None:
    """One SFT model per domain (stage 2 starts from it) and one on both domains' conversations, `general`
    (the student stage 3 starts from, as v4_consolidation.yaml's student is sft_general)."""
    for domain in [*DOMAINS, "general"]:
        record(f"stage1_{domain}", dockyard_run("sft_smol.yaml", {"DOCKYARD_DOMAIN": domain}, *extra))


def stage2(extra: list[str]) -> None:
    for domain in DOMAINS:
        record(f"stage2_{domain}", dockyard_run("grpo_domain_smol.yaml", {"DOCKYARD_DOMAIN": domain}, *extra))


def stage3(extra: list[str]) -> None:
    record("stage3", dockyard_run("v4_consolidation_smol.yaml", {}, *extra))


def mixed(extra: list[str], budget_s: float | None) -> None:
    """One GRPO run on both domains for the recipe's whole wall time (stages 1-3, start-ups included),
    then stopped. Its steps differ in length from stage 2's (the base model answers at length), so the
    budget is wall time, not a step count. The budget can be given instead, for stages that ran on a busy
    machine."""
    if budget_s is None:
        recorded = runs_dir() / "v4_recipe_times.json"
        if not recorded.is_file():
            raise SystemExit(f"v4_recipe: {recorded} does not exist (stages 1-3 write it); "
                             "run them first or give the budget with --budget-s")
        times = json.loads(recorded.read_text())
        budget_s = sum(seconds for stage, seconds in times.items() if stage.startswith("stage"))
    pointer = runs_dir() / "grpo_mixed_smol" / "checkpoints" / "latest_checkpointed_iteration.txt"
    if pointer.is_file():
        raise SystemExit(f"v4_recipe: {pointer.parent} already holds a checkpoint; the run would resume and train "
                         f"past its budget. Remove {pointer.parent.parent} first.")
    print(f"mixed GRPO: {budget_s:.0f} s of recipe time", flush=True)
    record("mixed", dockyard_run("grpo_mixed_smol.yaml", {}, *extra, stop_after_s=budget_s))


def accuracy(model: Path, domain: str, limit: int) -> float:
    """Greedy held-out accuracy, scored as validation scores it (the math environment's answer check)."""
    import torch

    from dockyard.config.schema.env import EnvConfig
    from dockyard.data.datasets import Prompt, build_messages, prompt_token_ids
    from dockyard.envs.math import MathEnvironment
    from dockyard.generation.engine import Engine, SamplingParams

    rows = [json.loads(line) for line in (data_dir() / "heldout" / f"{domain}.jsonl").read_text().splitlines()][:limit]
    prompts = [Prompt(r["input"], r["label"], r["metadata"], domain) for r in rows]
    env = MathEnvironment(EnvConfig(name="math", instruction=INSTRUCTION))
    engine = Engine(model, dtype=torch.float32, max_batch_size=100)
    ids = [prompt_token_ids(engine.tokenizer, build_messages(p, None, INSTRUCTION)) for p in prompts]
    completions = engine.generate(ids, SamplingParams(n=1, max_tokens=24, temperature=0.0))
    answers = {c.prompt_index: engine.tokenizer.decode(c.token_ids, skip_special_tokens=True) for c in completions}
    return sum(env.score(answers[i], p) >= 1.0 for i, p in enumerate(prompts)) / len(prompts)


def evaluate(limit: int, with_sft: bool) -> None:
    models = {"base (SmolLM2-135M-Instruct)": Path(os.environ.get("DOCKYARD_MODELS_DIR", "models")) /
              "smollm2-135m-instruct"}
    for domain in DOMAINS:
        if with_sft:
            models[f"stage 1 SFT {domain}"] = runs_dir() / f"sft_{domain}" / "checkpoints" / "hf"
        models[f"stage 2 expert {domain}"] = runs_dir() / f"grpo_{domain}" / "checkpoints" / "hf"
    if with_sft:
        models["stage 1 SFT general (the student)"] = runs_dir() / "sft_general" / "checkpoints" / "hf"
    models["stage 3 consolidated student"] = runs_dir() / "v4_consolidation_smol" / "checkpoints" / "hf"
    models["mixed GRPO (same total time)"] = runs_dir() / "grpo_mixed_smol" / "checkpoints" / "hf"
    print(f"{'model':<34}" + "".join(f"{d:>18}" for d in DOMAINS))
    for label, folder in models.items():
        if not (folder / "config.json").is_file():
            print(f"{label:<34}  (not built: {folder})")
            continue
        print(f"{label:<34}" + "".join(f"{accuracy(folder, d, limit):>18.1%}" for d in DOMAINS), flush=True)
    times = runs_dir() / "v4_recipe_times.json"
    if times.is_file():
        print("wall time per stage (s):", json.loads(times.read_text()))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["all", "data", "stage1", "stage2", "stage3", "mixed", "eval"])
    parser.add_argument("--heldout", type=int, default=150, help="held-out prompts per domain in eval")
    parser.add_argument("--with-sft", action="store_true", help="eval: also the stage-1 models")
    parser.add_argument("--budget-s", type=float, help="mixed: the recipe's wall time in seconds "
                        "(default: the stages' recorded times, runs/v4_recipe_times.json)")
    parser.add_argument("overrides", nargs="*", help="passed to every stage's dockyard run")
    args = parser.parse_args()
    steps = {"data": lambda: make_data(), "stage1": lambda: stage1(args.overrides),
             "stage2": lambda: stage2(args.overrides), "stage3": lambda: stage3(args.overrides),
             "mixed": lambda: mixed(args.overrides, args.budget_s), "eval": lambda: evaluate(args.heldout, args.with_sft)}
    for name in (["data", "stage1", "stage2", "stage3", "mixed", "eval"] if args.what == "all" else [args.what]):
        steps[name]()
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    sys.exit(main())
