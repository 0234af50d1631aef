"""Model, tokenizer and checkpoint folders as the run will read them: the folder's files
(model_files.py: config, safetensors headers, shards), a tokenizer that loads and a chat template
that renders a message, a tensor-parallel plan, checkpoint steps to start or resume from."""

from __future__ import annotations

from pathlib import Path

from dockyard.config.errors import Problem

def check_tokenizer(field: str, path: str, chat_template_file: str | None, needs_template: bool) -> list[Problem]:
    """The tokenizer loads and renders a user message through the chat template the run uses."""
    from dockyard.models import load_tokenizer

    try:
        tokenizer = load_tokenizer(path)
    except Exception as err:   # transformers raises many kinds; each names the file
        return [Problem(field, f"the tokenizer in {path} does not load: {type(err).__name__}: "
                        f"{str(err).splitlines()[0] if str(err) else ''}")]
    if not needs_template:
        return []
    template = None
    if chat_template_file:
        try:
            template = Path(chat_template_file).read_text()
        except OSError as err:
            return [Problem("policy.generation.chat_template.path", f"{chat_template_file}: cannot be read ({err})")]
    if template is None and not tokenizer.chat_template:
        return [Problem(field, f"the tokenizer in {path} has no chat template; set "
                        "policy.generation.chat_template.path")]
    try:
        tokenizer.apply_chat_template([{"role": "user", "content": "1+1?"}], chat_template=template,
                                      tokenize=False, add_generation_prompt=True)
    except Exception as err:   # a Jinja error names the template line
        where = chat_template_file or f"{path} (its chat template)"
        return [Problem("policy.generation.chat_template.path" if chat_template_file else field,
                        f"{where} does not render a user message: {type(err).__name__}: {err}")]
    return []


def check_tensor_parallel_plan(path: str, size: int) -> list[Problem]:
    """The model's architecture has a TP plan this backend applies, and its heads split over `size` ranks."""
    from transformers import AutoConfig

    from dockyard.policy.tensor_parallel import TensorParallelError, layer_plan

    try:
        layer_plan(AutoConfig.from_pretrained(path), size, path)
    except TensorParallelError as err:
        field, _, message = str(err).partition(": ")
        return [Problem(field, message)]
    except (OSError, ValueError) as err:   # config.json problems are reported by check_model_folder
        return [Problem("policy.model_name", f"{path}: its config does not load: {err}")]
    return []


def check_megatron_model(cfg) -> list[Problem]:
    """The megatron converter knows the policy model's family, its heads, MLP and vocabulary split over
    TP, its layers over PP and its experts over EP, and megatron-core's config classes accept the
    forwarded fields' values."""
    from dockyard.policy.megatron.settings import upstream_settings

    def check(shape, folder):
        shape.check_split(cfg.policy.megatron_cfg.tensor_model_parallel_size, folder)
        megatron = cfg.policy.megatron_cfg
        shape.check_stages(megatron.pipeline_model_parallel_size, folder,
                           megatron.virtual_pipeline_model_parallel_size or 1)
        shape.check_experts(megatron.expert_model_parallel_size, folder)
        upstream_settings(cfg, shape, trainable=True)
    return _decoder_problems(cfg, "megatron", check)


def check_jax_model(cfg) -> list[Problem]:
    """The JAX decoder knows the policy model's family, and its heads, MLP and vocabulary split over the
    mesh's `model` axis."""
    def check(shape, folder):
        shape.check_split(cfg.policy.jax_cfg.mesh.model, folder, "policy.jax_cfg.mesh.model", "devices")
    return _decoder_problems(cfg, "jax", check)


def _decoder_problems(cfg, backend: str, check) -> list[Problem]:
    """`check(shape, folder)` of the policy model's decoder shape, for a backend that builds its own model;
    what it (or the shape) refuses, as a problem naming the field."""
    import json

    from dockyard.models import model_folder
    from dockyard.policy.decoder_shape import DecoderShape
    from dockyard.policy.samples import PolicySetupError

    path = cfg.policy.model_name
    try:
        folder = model_folder(path)
        check(DecoderShape.of(json.loads((folder / "config.json").read_text()), str(folder), backend), str(folder))
    except PolicySetupError as err:
        field, _, message = str(err).partition(": ")
        return [Problem("policy.model_name" if field == f"policy.backend {backend}" else field, message)]
    except (OSError, ValueError, KeyError) as err:   # config.json problems are reported by check_model_folder
        return [Problem("policy.model_name", f"{path}: its config does not describe a decoder: {err}")]
    return []


def check_generation_tensor_parallel(field: str, path: str, size: int, note: str = "") -> list[Problem]:
    """A generation server's tensor-parallel `size` splits the model's attention heads as vLLM and
    SGLang require (heads divisible by it; key/value heads divisible by it, or it by them): refused
    here, not 25 s into the job when the server would not start."""
    if size <= 1:
        return []
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(path)
    except (OSError, ValueError):
        return []   # config.json problems are reported by check_model_folder
    config = getattr(config, "text_config", None) or config
    heads = getattr(config, "num_attention_heads", None)
    if not heads:
        return []
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    fits = heads % size == 0 and (kv_heads % size == 0 if kv_heads >= size else size % kv_heads == 0)
    if fits:
        return []
    sizes = [n for n in range(1, heads + 1) if heads % n == 0 and (kv_heads % n == 0 if kv_heads >= n else n % kv_heads == 0)]
    return [Problem(field, f"{size}{note} does not split {path}'s {heads} attention heads ({kv_heads} key/value heads) "
                           f"over its ranks; the server would not start. Sizes that do: {', '.join(map(str, sizes))}")]


def check_checkpoint_step(field: str, path: str) -> list[Problem]:
    from dockyard.models import ModelNotFoundError, checkpoint_weights_folder

    try:
        checkpoint_weights_folder(path)
    except ModelNotFoundError as err:
        return [Problem(field, str(err))]
    return []


def check_resume(checkpointing) -> list[Problem]:
    """resume_from: a given step is complete; auto: the pointer, if any, names a complete step."""
    if not checkpointing.enabled and checkpointing.resume_from in (None, "auto"):
        return []
    if checkpointing.resume_from is None:
        return []
    if checkpointing.resume_from != "auto":
        return check_checkpoint_step("checkpointing.resume_from", checkpointing.resume_from)
    pointer = Path(checkpointing.checkpoint_dir) / "latest_checkpointed_iteration.txt"
    if not pointer.is_file():
        return []
    step = pointer.read_text().strip()
    path = pointer.parent / f"step_{step}"
    problems = check_checkpoint_step("checkpointing.checkpoint_dir", str(path))
    return [Problem(p.path, f"{pointer} names step {step} (the run would resume from it): {p.message}")
            for p in problems]
