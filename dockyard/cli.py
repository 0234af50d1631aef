"""Command line: `dockyard validate | run | list | env | export` and `dockyard-submit`.

Config problems exit with status 2 and a list of what is wrong; they never print a traceback.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

from dockyard import registry
from dockyard.config import ConfigError, load_config
from dockyard.errors import DockyardError

EXIT_CONFIG = 2


def _is_override(arg: str) -> bool:
    return "=" in arg or arg.startswith("~")


def _split_positionals(args: Sequence[str]) -> tuple[list[str], list[str]]:
    paths = [a for a in args if not _is_override(a)]
    overrides = [a for a in args if _is_override(a)]
    return paths, overrides


def _config_files(target: str, config_dirs: list[str]) -> list[str]:
    """A folder validates every top-level YAML in it (group folders hold fragments, not configs)."""
    path = Path(target)
    if path.is_dir():
        return sorted(str(p) for p in path.glob("*.yaml"))
    return [target]


def cmd_validate(ns: argparse.Namespace) -> int:
    paths, overrides = _split_positionals(ns.args)
    targets = ([ns.config] if ns.config else []) + paths
    if not targets:
        print("dockyard validate: give a config file or folder (--config FILE or a path)", file=sys.stderr)
        return EXIT_CONFIG
    files = [f for t in targets for f in _config_files(t, ns.config_dir)]
    if not files:
        print(f"dockyard validate: no .yaml files in {', '.join(targets)}", file=sys.stderr)
        return EXIT_CONFIG
    failed = 0
    for file in files:
        try:
            loaded = load_config(file, overrides, ns.config_dir)
        except ConfigError as err:
            failed += 1
            print(err.render(), file=sys.stderr)
            continue
        loaded.print_advice()
        if ns.preflight:
            from dockyard.config.job_plan import plan_job
            from dockyard.preflight import preflight

            report = preflight(loaded.config, "submit", plan_job(loaded.config))
            report.print("dockyard validate", loaded.source)
            if report.problems:
                failed += 1
                continue
        if ns.out:
            if len(files) > 1:
                print("dockyard validate: --out takes one config", file=sys.stderr)
                return EXIT_CONFIG
            Path(ns.out).parent.mkdir(parents=True, exist_ok=True)
            Path(ns.out).write_text(loaded.to_yaml())
        if ns.show:
            print(f"# {loaded.source}")
            print(loaded.to_yaml())
        print(f"ok: {loaded.source}" if len(files) > 1 or not ns.show else f"# ok: {loaded.source}")
    if len(files) > 1:
        print(f"{len(files) - failed} ok, {failed} invalid")
    return EXIT_CONFIG if failed else 0


def _load(ns: argparse.Namespace, command: str):
    """The config of --config with its overrides, or None once the problems are printed."""
    if not ns.config:
        print(f"dockyard {command}: --config is required", file=sys.stderr)
        return None
    try:
        loaded = load_config(ns.config, ns.overrides, ns.config_dir)
    except ConfigError as err:
        print(err.render(), file=sys.stderr)
        return None
    loaded.print_advice()
    return loaded


def cmd_run(ns: argparse.Namespace) -> int:
    from dockyard.run.local import run_local

    loaded = _load(ns, "run")
    return EXIT_CONFIG if loaded is None else run_local(loaded)


def cmd_rollout_worker(ns: argparse.Namespace) -> int:
    from dockyard.plane.worker import run_worker

    loaded = _load(ns, "rollout-worker")
    return EXIT_CONFIG if loaded is None else run_worker(loaded, ns.worker_id, ns.max_groups)


def cmd_list(ns: argparse.Namespace) -> int:
    kinds = [ns.kind] if ns.kind else list(registry.KINDS)
    for kind in kinds:
        if kind not in registry.KINDS:
            print(f"dockyard list: unknown kind {kind!r}; kinds: {', '.join(registry.KINDS)}", file=sys.stderr)
            return EXIT_CONFIG
        print(f"{kind}: {registry.KINDS[kind]}")
        entries = registry.entries(kind)
        width = max([16] + [len(entry.name) for entry in entries])
        for entry in entries:
            status = "" if entry.available else "  [not yet available]"
            print(f"  {entry.name:<{width}} {entry.doc}{status}")
    return 0


def cmd_env_check(ns: argparse.Namespace) -> int:
    from dockyard.envs.check import check

    loaded = _load(ns, "env check")
    return EXIT_CONFIG if loaded is None else check(loaded.config, ns.tasks, ns.agent, logs=ns.logs, rebuild=ns.rebuild)


def cmd_env_build(ns: argparse.Namespace) -> int:
    from dockyard import registry
    from dockyard.envs.check import task_source

    loaded = _load(ns, "env build")
    if loaded is None:
        return EXIT_CONFIG
    environment = registry.get("environment", loaded.config.env.name).factory
    build = getattr(environment, "build_command", None)
    if build is None:
        print(f"dockyard env build: environment {loaded.config.env.name!r} builds no images (env.name)", file=sys.stderr)
        return EXIT_CONFIG
    try:
        return build(loaded.config, task_source(loaded.config, ns.tasks), rebuild=ns.rebuild)
    except ValueError as err:   # an environment's own settings, refused by its constructor
        print(f"dockyard env build: {err}", file=sys.stderr)
        return EXIT_CONFIG


def cmd_env_serve_swe(ns: argparse.Namespace) -> int:
    from dockyard.envs.swe_server import serve

    loaded = _load(ns, "env serve-swe")
    return EXIT_CONFIG if loaded is None else serve(loaded.config, ns.host, ns.port, ns.address_file)


def cmd_env_index(ns: argparse.Namespace) -> int:
    import json

    from dockyard.envs import osworld_tasks, terminal_tasks

    out = Path(ns.out) if ns.out else None
    folder = Path(ns.folder)
    # a folder of task folders (task.yaml / task.toml) is terminal tasks; one of task JSON files is OSWorld's
    terminal = folder.is_file() or any(folder.glob("**/task.yaml")) or any(folder.glob("**/task.toml"))
    index_rows = terminal_tasks.index_rows if terminal or not any(folder.glob("**/*.json")) else osworld_tasks.index_rows
    rows = index_rows(folder, out.parent if out else Path.cwd())
    text = "".join(json.dumps(row) + "\n" for row in rows)
    if out:
        out.write_text(text)
        print(f"wrote {len(rows)} tasks to {out}")
    else:
        sys.stdout.write(text)
    return 0


def cmd_env_generate(ns: argparse.Namespace) -> int:
    from dockyard.envs.terminal_families.splits import DEFAULT_UNSEEN, FAMILIES, PlanError, SplitPlan, generate

    def names(text: str | None, default: tuple[str, ...]) -> tuple[str, ...]:
        return default if text is None else tuple(n.strip() for n in text.split(",") if n.strip())

    levels = names(ns.levels, ("1", "2", "3"))
    if not all(level.isdigit() for level in levels):
        raise PlanError(f"levels: {ns.levels!r} must be numbers among 1, 2, 3")
    plan = SplitPlan(seed=ns.seed, train_per_family=ns.train, heldout_per_family=ns.heldout,
                     unseen_per_family=ns.unseen_count, unseen=names(ns.unseen, DEFAULT_UNSEEN),
                     families=names(ns.families, tuple(FAMILIES)), levels=tuple(map(int, levels)))
    counts = generate(plan, ns.out)
    print(f"wrote {', '.join(f'{n} {split}' for split, n in counts.items())} tasks under {ns.out} "
          f"({', '.join(f'{split}.jsonl' for split in counts)}; plan.json)")
    return 0


def cmd_env_demonstrate(ns: argparse.Namespace) -> int:
    from dockyard.envs.demonstrations import write_demonstrations

    loaded = _load(ns, "env demonstrate")
    if loaded is None:
        return EXIT_CONFIG
    written, left_out = write_demonstrations(loaded.config, ns.tasks, ns.out)
    for why in left_out:
        print(f"left out: {why}", file=sys.stderr)
    print(f"wrote {written} demonstration(s) to {ns.out}" + (f"; {len(left_out)} task(s) left out" if left_out else ""))
    return 1 if left_out and not written else 0


def cmd_export_hf(ns: argparse.Namespace) -> int:
    import time

    from dockyard.io.hf_export import export_step

    started = time.perf_counter()
    out = export_step(ns.checkpoint, ns.out, ns.model)
    print(f"wrote {out} in {time.perf_counter() - started:.1f} s")
    return 0


def cmd_export_gguf(ns: argparse.Namespace) -> int:
    import time

    from dockyard.io.gguf_export import export_gguf_variants, validate_gguf

    quants = ns.quant or ["f16"]
    started = time.perf_counter()
    outputs = export_gguf_variants(ns.hf, ns.out, quants, ns.llama_cpp_dir)
    for path in outputs:
        summary = validate_gguf(path)
        print(f"wrote {path} ({path.stat().st_size / 2**20:.1f} MiB; {summary['architecture']}, "
              f"{summary['tensors']} tensors: {', '.join(summary['types'])}; validated)")
    print(f"{len(outputs)} GGUF file(s) in {time.perf_counter() - started:.1f} s")
    return 0


def cmd_validate_gguf(ns: argparse.Namespace) -> int:
    from dockyard.io.gguf_export import GGUFExportError, validate_gguf

    failed = 0
    for path in ns.files:
        try:
            summary = validate_gguf(path, ns.hf)
        except GGUFExportError as err:
            print(f"dockyard export validate-gguf: {err}", file=sys.stderr)
            failed += 1
            continue
        print(f"{path}: ok ({summary['architecture']}, {summary['tensors']} tensors: {', '.join(summary['types'])})")
    return 1 if failed else 0


def _add_config_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="config file (a path, or a name from the config family)")
    parser.add_argument("--config-dir", action="append", default=[], metavar="DIR",
                        help="extra folder searched for configs and groups before the shipped family (repeatable)")


def _add_task_set_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tasks", metavar="DIR|JSONL", help="task folder(s) or jsonl index "
                        "(default: the config's first data.datasets path)")
    parser.add_argument("--rebuild", action="store_true", help="with env.sandbox.task_images build: build every "
                        "task's image again from nothing first (no cached layer: a changed base or package index "
                        "is taken up)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dockyard", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    validate = sub.add_parser("validate", help="check configs and print every violation, or ok")
    _add_config_args(validate)
    validate.add_argument("--show", action="store_true", help="print the resolved config")
    validate.add_argument("--out", metavar="FILE", help="write the resolved config to FILE (what a job reads)")
    validate.add_argument("--preflight", action="store_true", help="also check what the run will read and where "
                          "it will run: datasets, model folders, output folders, the Slurm partition, account "
                          "and QOS, installed backends (what dockyard-submit checks before it queues a job)")
    validate.add_argument("args", nargs="*", metavar="PATH|OVERRIDE",
                          help="config files or folders, and Hydra overrides (a.b=v, +a.new=v, ~a.b)")
    validate.set_defaults(func=cmd_validate)

    run = sub.add_parser("run", help="run the GRPO loop on this machine (no Slurm)")
    _add_config_args(run)
    run.add_argument("overrides", nargs="*", metavar="OVERRIDE", help="Hydra overrides")
    run.set_defaults(func=cmd_run)

    worker = sub.add_parser("rollout-worker", help="join a data-plane run (data_plane) as a rollout worker: start "
                            "generation servers here, take prompts, push scored groups, follow weight versions")
    _add_config_args(worker)
    worker.add_argument("--worker-id", help="the worker's name on the plane (default: host and Slurm job or pid)")
    worker.add_argument("--max-groups", type=int, help="leave after pushing this many groups")
    worker.add_argument("overrides", nargs="*", metavar="OVERRIDE", help="Hydra overrides")
    worker.set_defaults(func=cmd_rollout_worker)

    env = sub.add_parser("env", help="environment tools").add_subparsers(dest="env_command", required=True)
    env_check = env.add_parser("check", help="run every task with the oracle or no-op agent in the configured "
                               "sandbox and print task, reward, seconds; exit 1 naming the broken tasks")
    _add_config_args(env_check)
    _add_task_set_args(env_check)
    env_check.add_argument("--agent", choices=["oracle", "noop"], default="oracle")
    env_check.add_argument("--logs", metavar="DIR", help="where each task's whole output goes, as <task>.log "
                           "(default: a new folder under /tmp, printed at the end)")
    env_check.add_argument("overrides", nargs="*", metavar="OVERRIDE", help="Hydra overrides")
    env_check.set_defaults(func=cmd_env_check)
    env_build = env.add_parser("build", help="build every terminal task's image, or every SWE row's "
                               "environment, ahead of a run (env.sandbox.task_images: build), one line per task; "
                               "exit 1 if one fails")
    _add_config_args(env_build)
    _add_task_set_args(env_build)
    env_build.add_argument("overrides", nargs="*", metavar="OVERRIDE", help="Hydra overrides")
    env_build.set_defaults(func=cmd_env_build)
    env_serve = env.add_parser("serve-swe", help="score SWE patches here for runs elsewhere (their "
                               "env.sandbox_urls), in this config's env.sandbox")
    _add_config_args(env_serve)
    env_serve.add_argument("--host", default="0.0.0.0")
    env_serve.add_argument("--port", type=int, default=8900, help="0 picks a free port (see --address-file)")
    env_serve.add_argument("--address-file", metavar="FILE", help="write {host, port, pid} here once listening")
    env_serve.add_argument("overrides", nargs="*", metavar="OVERRIDE", help="Hydra overrides")
    env_serve.set_defaults(func=cmd_env_serve_swe)
    env_index = env.add_parser("index", help="write the jsonl dataset rows (instruction, task.path) of a folder of "
                               "terminal tasks, for data.datasets[].path")
    env_index.add_argument("folder")
    env_index.add_argument("--out", metavar="FILE", help="write here (paths relative to it); default: stdout")
    env_index.set_defaults(func=cmd_env_index)

    env_generate = env.add_parser("generate", help="write procedural terminal tasks (task families, Terminal-Bench "
                                  "layout) in three splits: train, heldout (new instances of the train families), "
                                  "unseen (families never trained on); the same options write the same bytes")
    env_generate.add_argument("--out", required=True, metavar="DIR", help="a new or empty folder")
    env_generate.add_argument("--seed", type=int, default=0)
    env_generate.add_argument("--train", type=int, default=24, metavar="N", help="tasks per train family (24)")
    env_generate.add_argument("--heldout", type=int, default=6, metavar="N", help="held-out tasks per train family (6)")
    env_generate.add_argument("--unseen-count", type=int, default=6, metavar="N", help="tasks per unseen family (6)")
    env_generate.add_argument("--unseen", metavar="F,F", help="families never trained on (log_summary,csv_join)")
    env_generate.add_argument("--families", metavar="F,...", help="the families used (default: all: count_lines, "
                              "sort_unique, replace_text, log_summary, csv_sum, csv_join, json_field, find_files, "
                              "rename_files, permissions, fix_script, git_ops)")
    env_generate.add_argument("--levels", metavar="1,2,3", help="difficulty levels used (default: all)")
    env_generate.set_defaults(func=cmd_env_generate)

    env_demo = env.add_parser("demonstrate", help="run each task's solution as the agent's own bash calls in the "
                              "configured sandbox and write the conversations (the agent loop's messages, real "
                              "outputs) as SFT rows ({messages, task}); tasks whose tests then fail are left out")
    _add_config_args(env_demo)
    env_demo.add_argument("--tasks", required=True, metavar="JSONL", help="task rows (read like data.datasets[0])")
    env_demo.add_argument("--out", required=True, metavar="FILE", help="the jsonl to write")
    env_demo.add_argument("overrides", nargs="*", metavar="OVERRIDE", help="Hydra overrides")
    env_demo.set_defaults(func=cmd_env_demonstrate)

    export = sub.add_parser("export", help="convert a saved checkpoint").add_subparsers(dest="export_command",
                                                                                         required=True)
    export_hf = export.add_parser("hf", help="write a Hugging Face folder (model.safetensors, config, tokenizer, "
                                  "generation config) from a saved step")
    export_hf.add_argument("--checkpoint", required=True, metavar="DIR",
                           help="a step_<N> folder, or a checkpoint_dir (its newest complete step)")
    export_hf.add_argument("--out", required=True, metavar="DIR", help="the folder to write (replaced if present)")
    export_hf.add_argument("--model", metavar="DIR", help="the model folder the run trained (default: the one the "
                           "step records)")
    export_hf.set_defaults(func=cmd_export_hf)
    export_gguf = export.add_parser("gguf", help="write GGUF builds of a Hugging Face folder with llama.cpp "
                                    "(DOCKYARD_LLAMA_CPP_DIR; tools/prepare_llama_cpp.sh) and validate each")
    export_gguf.add_argument("--hf", required=True, metavar="DIR", help="a Hugging Face folder (dockyard export hf)")
    export_gguf.add_argument("--out", required=True, metavar="FILE",
                             help="the .gguf file; with several --quant, a prefix (<out>-<quant>.gguf each)")
    export_gguf.add_argument("--quant", action="append", metavar="TYPE",
                             help="f16 (default), bf16, f32, Q8_0, or any llama-quantize type (Q4_K_M, Q5_K_M, "
                             "Q6_K, ...); repeat for several builds")
    export_gguf.add_argument("--llama-cpp-dir", metavar="DIR", help="default: $DOCKYARD_LLAMA_CPP_DIR")
    export_gguf.set_defaults(func=cmd_export_gguf)
    check_gguf = export.add_parser("validate-gguf", help="check GGUF files: architecture, every tensor present, "
                                   "float tensors finite; exit 1 naming the first problem of each")
    check_gguf.add_argument("files", nargs="+", metavar="FILE")
    check_gguf.add_argument("--hf", metavar="DIR", help="also require every tensor this HF folder's weights map to")
    check_gguf.set_defaults(func=cmd_validate_gguf)

    image = sub.add_parser("image", help="the dockyard image for cluster.container").add_subparsers(
        dest="image_command", required=True)
    image_build = image.add_parser("build", help="build the dockyard image without a registry (podman, a local "
                                   "Debian base), cached by the hash of what goes in; write its runtime forms")
    image_build.add_argument("--output", default="images", metavar="DIR",
                             help="where the image folders go (<DIR>/<key>, <DIR>/latest); on a file system every "
                             "node sees, the same as the job folder's for slurm_oci (default: ./images)")
    image_build.add_argument("--base", default="localhost/dockyard-base:bookworm", metavar="IMAGE",
                             help="the local base image (made by tools/build_base_image.sh when missing)")
    image_build.add_argument("--extras", default="plane", help="dockyard's extras to install (default: plane)")
    image_build.add_argument("--force", action="store_true", help="build from scratch even when the cache has it "
                             "(podman's layer cache too)")
    image_build.set_defaults(func=cmd_image_build)

    step = sub.add_parser("container-step", help="for hand-written sbatch scripts (slurm/trainer_step.sh): one word per "
                          "line of what a component's step needs for cluster.container (nothing when it runs in none)")
    _add_config_args(step)
    step.add_argument("--folder", required=True, metavar="DIR", help="the job folder (slurm_oci bundles go there)")
    step.add_argument("--component", default="trainer", choices=["trainer", "rollout", "teacher"])
    step.add_argument("--part", required=True, choices=["srun-flags", "command"],
                      help="srun-flags: srun's own options (writes the slurm_oci bundle); command: the words before "
                      "the step's Python arguments, the image's Python last")
    step.add_argument("overrides", nargs="*", metavar="OVERRIDE", help="Hydra overrides")
    step.set_defaults(func=cmd_container_step)

    listing = sub.add_parser("list", help="print the component catalog by kind")
    listing.add_argument("kind", nargs="?", help="only this kind")
    listing.set_defaults(func=cmd_list)
    return parser


def cmd_container_step(ns) -> int:
    from dockyard.launch.containers import step_container

    loaded = _load(ns, "container-step")
    if loaded is None:
        return 2
    folder = Path(ns.folder)
    container = step_container(loaded.config, ns.component, folder)
    if container is None:
        return 0
    if ns.part == "srun-flags":
        if container.runtime in ("slurm_oci", "charliecloud"):   # every component's: rank 0 starts the servers' steps with theirs
            from dockyard.config.job_plan import plan_job
            from dockyard.launch.submit import write_bundles

            write_bundles(loaded.config, plan_job(loaded.config), folder)
        words = container.srun_flags(folder)
    else:
        if container.runtime == "charliecloud" and container.root and not Path(container.root).is_dir():
            from dockyard.config.job_plan import plan_job
            from dockyard.launch.submit import write_bundles

            write_bundles(loaded.config, plan_job(loaded.config), folder)
        words = container.wrapper() + container.entry() + [container.python]
    print("\n".join(words))
    return 0


def cmd_image_build(ns) -> int:
    from dockyard.launch.image_build import build_image

    folder = build_image(Path(ns.output), ns.base, ns.extras, ns.force)
    print(folder)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    ns = build_parser().parse_args(argv)
    try:
        return ns.func(ns)
    except DockyardError as err:   # it names the file or setting at fault; a traceback would bury that
        words = [ns.command] + [getattr(ns, f"{ns.command}_command", None) or ""]
        print(f"dockyard {' '.join(w for w in words if w)}: {err.report()}", file=sys.stderr)
        return err.exit_status


def submit_main(argv: Sequence[str] | None = None) -> int:
    from dockyard.launch.submit import submit_main as run

    return run(argv)


if __name__ == "__main__":
    sys.exit(main())
