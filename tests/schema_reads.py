"""What the suite's record of config reads (dockyard/config/field_reads.py) is compared with: every
schema field, by dotted path, must be read by the package's code during the suite, unless it sits
behind a switch this version refuses (GATED), is refused unless left at its default
(REFUSED_UNLESS_DEFAULT), is acted on while the config loads (WHILE_LOADING), or is read only where
this machine cannot run (ELSEWHERE, with the reader). tests/conftest.py runs the comparison at the end
of a whole suite."""

from dockyard.config.field_reads import schema_paths
from dockyard.config.schema import MasterConfig

# Sections that apply only behind a switch this version refuses: the overrides that turn it on, the
# path it is refused by. A field under one of them needs no reader of its own.
GATED = {
    "policy.megatron_cfg.": ("policy.backend=megatron policy.megatron_cfg={}", "policy.backend"),
    "policy.generation.router.": ("policy.generation.router.proxy_timeout_s=5", "policy.generation.router"),
    "grpo.rollout_data_path": ("grpo.run_mode=train_only", "grpo.run_mode"),
}

# Fields read only on code paths this machine cannot take (GPUs, SGLang's engine), with the reader.
ELSEWHERE = {
    "policy.generation.vllm_cfg.gpu_memory_utilization": "generation/vllm.py: --gpu-memory-utilization, on GPUs only",
    "policy.generation.sglang_cfg.env_vars": "generation/sglang.py: the SGLang server's environment (a GPU engine)",
    "logger.monitor_gpus": "loop/trainer.py: GPU figures, with GPUs only",
}
# Acted on while the config loads, before any code of the package reads it.
WHILE_LOADING = {"imports": "config/loader.py imports the modules so their components validate"}
# Accepted by the schema only at their defaults: any other value is refused by the named rule.
REFUSED_UNLESS_DEFAULT = {f"data.validation.{name}": "validation_is_not_drawn_from"
           for name in ("shuffle", "num_prompts_per_step", "weight", "teacher_name")}


def unread(reads: set[str]) -> list[str]:
    return [path for path in schema_paths(MasterConfig) if path not in reads
            and path not in {**ELSEWHERE, **WHILE_LOADING, **REFUSED_UNLESS_DEFAULT}
            and not any(path.startswith(prefix) or path == prefix.rstrip(".") for prefix in GATED)]
