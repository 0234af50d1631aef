"""One preflight for `dockyard-submit` (before anything is queued), `dockyard run` (before any process
starts) and `dockyard validate --preflight`: everything the submitting machine can check about a
valid config, every problem at once, each named by its field and file. Checks that only the compute
nodes can make are listed as skipped, never passed silently. docs/preflight.md lists them all."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Literal

from dockyard.config.errors import Problem
from dockyard.config.schema import MasterConfig

Where = Literal["submit", "local"]


@dataclass
class Report:
    problems: list[Problem] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def print(self, who: str, source: str) -> None:
        if self.problems:
            count = len(self.problems)
            print(f"{who}: config {source} cannot run ({count} problem{'s' if count != 1 else ''}):",
                  file=sys.stderr)
            for problem in self.problems:
                print(f"  - {problem}", file=sys.stderr)
        for note in self.skipped:
            print(f"{who}: preflight skipped: {note}", file=sys.stderr)
        for note in self.notes:
            print(f"{who}: note: {note}", file=sys.stderr)


def server_tensor_parallel(cfg: MasterConfig, teacher: bool = False) -> tuple[str, int, str] | None:
    """(field, size, note) of a generation server's tensor parallelism: the rollout servers' (vLLM or
    SGLang), or with `teacher` the teacher servers' (their own size on GPUs)."""
    backend = cfg.policy.generation.backend
    if backend not in ("vllm", "sglang"):
        return None
    if teacher and cfg.cluster.gpus_per_node > 0:
        return ("on_policy_distillation.parallelism.tensor_parallel_size",
                cfg.on_policy_distillation.parallelism.tensor_parallel_size, "")
    settings = cfg.policy.generation.vllm_cfg if backend == "vllm" else cfg.policy.generation.sglang_cfg
    size = settings.tensor_parallel_size
    note = (" (= cluster.rollout_gpus_per_replica)" if size == cfg.cluster.rollout_gpus_per_replica and size > 1
            else "")
    return f"policy.generation.{backend}_cfg.tensor_parallel_size", size, note


def model_problems(cfg: MasterConfig) -> tuple[list[Problem], int]:
    """Every model, tokenizer and checkpoint folder the run reads; and the policy's parameter count."""
    from dockyard.model_files import check_model_folder
    from dockyard.preflight.model_folders import (check_checkpoint_step, check_generation_tensor_parallel,
                                                  check_jax_model, check_megatron_model, check_resume,
                                                  check_tensor_parallel_plan, check_tokenizer)

    problems, parameters = check_model_folder("policy.model_name", cfg.policy.model_name)
    tokenizer_field, tokenizer = (("policy.tokenizer_name", cfg.policy.tokenizer_name) if cfg.policy.tokenizer_name
                                  else ("policy.model_name", cfg.policy.model_name))
    tokenizer_problems, _ = check_model_folder(tokenizer_field, tokenizer) if cfg.policy.tokenizer_name else ([], 0)
    problems += tokenizer_problems
    if not problems:
        problems += check_tokenizer(tokenizer_field, tokenizer, cfg.policy.generation.chat_template.path, True)
    tensor_parallel = cfg.policy.dtensor_cfg.tensor_parallel_size
    if not problems and cfg.policy.backend == "dtensor" and tensor_parallel > 1:
        problems += check_tensor_parallel_plan(cfg.policy.model_name, tensor_parallel)
    if not problems and cfg.policy.backend == "megatron" and cfg.policy.megatron_cfg is not None:
        problems += check_megatron_model(cfg)
    if not problems and cfg.policy.backend == "jax":
        problems += check_jax_model(cfg)
    server_tp = server_tensor_parallel(cfg)
    if not problems and server_tp:
        problems += check_generation_tensor_parallel(*server_tp[:1], cfg.policy.model_name, *server_tp[1:])
    reference = cfg.loss_fn.reference_model
    if cfg.loss_fn.reference_policy_kl_penalty > 0:
        if reference.checkpoint_path:
            # a set but unusable checkpoint never falls back to hf_path
            problems += check_checkpoint_step("loss_fn.reference_model.checkpoint_path", reference.checkpoint_path)
        elif reference.hf_path:
            problems += check_model_folder("loss_fn.reference_model.hf_path", reference.hf_path)[0]
    for index, teacher in enumerate(cfg.on_policy_distillation.teachers if cfg.on_policy_distillation else []):
        teacher_problems = check_model_folder(f"on_policy_distillation.teachers[{index}].hf_path", teacher.hf_path)[0]
        problems += teacher_problems
        teacher_tp = server_tensor_parallel(cfg, teacher=True)
        if not teacher_problems and teacher_tp:
            problems += check_generation_tensor_parallel(teacher_tp[0], teacher.hf_path, *teacher_tp[1:])
        if teacher.checkpoint_path:
            problems += check_checkpoint_step(f"on_policy_distillation.teachers[{index}].checkpoint_path",
                                              teacher.checkpoint_path)
    return problems + check_resume(cfg.checkpointing), parameters


def preflight(cfg: MasterConfig, where: Where, plan=None, slurm: bool = True) -> Report:
    """`plan` (the job plan) with `slurm` asks the cluster about it; `where="local"` checks this
    machine can hold the run instead."""
    from dockyard.preflight.components import backend_installed, local_shape, teacher_routing, unsupported
    from dockyard.preflight.datasets import check_datasets
    from dockyard.preflight.outputs import check_outputs

    report = Report(unsupported(cfg) + backend_installed(cfg))
    if where == "local":
        from dockyard.preflight.cpu import bf16_notes, cpu_flags

        report.problems += local_shape(cfg)
        report.notes += bf16_notes(cfg, cpu_flags())
    models, parameters = model_problems(cfg)
    report.problems += models
    datasets, notes = check_datasets(cfg)
    report.notes += notes
    report.problems += datasets
    if not datasets and not models:
        report.problems += teacher_routing(cfg)
    outputs, notes = check_outputs(cfg, parameters)
    report.problems += outputs
    report.skipped += notes
    if where == "submit":
        if plan is not None and slurm:
            from dockyard.preflight.slurm import check_slurm

            problems, notes = check_slurm(cfg, plan)
            report.problems += problems
            report.skipped += notes
        if cfg.cluster.gpus_per_node > 0:
            report.skipped.append("CUDA devices and drivers: only the compute nodes can check them (at job start)")
    return report
