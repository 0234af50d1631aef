"""The built-in catalog. Entries with a target ("module:attribute") are implemented and imported
only when first built, so `dockyard validate` stays light; entries without one are selectable in
configs (and validate) but not implemented yet: `dockyard list` marks them "not yet available" and
building one fails with that message instead of a stub running.
"""

from dockyard.registry import declare

_IMPLEMENTED = {
    ("advantage_estimator", "grpo"): "dockyard.algorithms.advantages:GroupRelativeAdvantage",
    ("loss", "clipped_pg"): "dockyard.algorithms.losses:ClippedPGLoss",
    ("loss", "gspo"): "dockyard.algorithms.losses:GSPOLoss",
    ("environment", "math"): "dockyard.envs.math:MathEnvironment",
    ("logger", "tensorboard"): "dockyard.io.metrics:TensorBoardWriter",
    ("generation_backend", "embedded"): "dockyard.generation.launcher:EmbeddedServer",
    ("policy_backend", "dtensor"): "dockyard.policy.dtensor:DTensorPolicy",
}

_DECLARED = {
    "advantage_estimator": {
        "grpo": "group-relative advantages with none/group/batch mean or z-score normalisation",
        "opd": "on-policy distillation: sg[log p_teacher - log p_student] per token",
    },
    "loss": {
        "clipped_pg": "PPO-style clipped policy gradient (clip-higher, dual clip, KL, entropy)",
        "gspo": "GSPO: clipped policy gradient on sequence-level importance ratios",
    },
    "environment": {
        "math": "reasoning-gym arithmetic / GSM-style tasks scored by their own verifiers",
        "swe": "SWE-bench style repository tasks: apply a patch, run the tests in a sandbox",
        "program_bench": "program synthesis: run candidate programs against hidden tests",
        "terminal_bench": "multi-turn shell tasks in a sandbox, scored by a checker script",
        "osworld": "computer-use tasks on a virtual desktop, scored by task evaluators",
        "gdpval": "file-producing knowledge-work tasks scored by a rubric grader",
        "hle": "Humanity's Last Exam questions with exact-answer scoring",
        "gpqa": "GPQA multiple-choice science questions",
    },
    "agent": {
        "tool_calling": "multi-turn agent: model emits tool calls, environment returns observations",
        "computer_use": "screenshot-in / action-out agent for GUI environments",
    },
    "logger": {
        "tensorboard": "TensorBoard event files under logger.log_dir",
        "wandb": "Weights & Biases runs",
        "mlflow": "MLflow tracking (list metrics summarised to mean/p50/p90/max)",
        "swanlab": "SwanLab runs",
    },
    "generation_backend": {
        "embedded": "dockyard's own HTTP engine (transformers + KV cache), CPU or one GPU",
        "vllm": "vLLM servers, one per rollout replica",
        "sglang": "SGLang servers, one per rollout replica",
    },
    "policy_backend": {
        "dtensor": "HF transformers model sharded with FSDP2 (fully_shard) over torch.distributed",
        "megatron": "megatron-core GPTModel with TP/PP/CP/EP parallelism",
        "jax": "Flax NNX trainer on JAX",
    },
    "sandbox": {
        "none": "run tool commands directly (trusted tasks only)",
        "bubblewrap": "unprivileged bwrap namespaces around each command",
        "podman": "one podman container per trajectory",
        "apptainer": "Apptainer/Singularity instance per trajectory",
        "enroot": "enroot container per trajectory (pyxis clusters)",
    },
}

for _kind, _names in _DECLARED.items():
    for _name, _doc in _names.items():
        declare(_kind, _name, _doc, _IMPLEMENTED.get((_kind, _name)))
