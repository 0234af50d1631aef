"""Settings the schema accepts either take effect or are refused by name before anything starts."""

import pytest
import torch

from dockyard.config import ConfigError, load_config
from dockyard.preflight.components import unsupported
from tests.schema_reads import GATED, REFUSED_UNLESS_DEFAULT

REFUSED = {
    "data.datasets.0.buffer_replay_strategy=lifo": "data.datasets[0].buffer_replay_strategy: the GRPO loops carry "
                                                   "no buffer",
    "policy.generation.router.port=8123": "policy.generation.router.port: there is no router process",
    "policy.generation.router.max_connections=4": "policy.generation.router.max_connections: there is no router",
    "logger.gpu_monitoring_interval_s=2": "logger.gpu_monitoring_interval_s: GPU figures are sampled once per step",
    "policy.dtensor_cfg.cpu_offload=true": "policy.dtensor_cfg.cpu_offload: the trainer runs on CPU",
    "+env.instrucion=Answer.": "env.instrucion: not a setting of the 'math' environment (it takes instruction)",
    "+grpo.adv_estimator.gamma=0.9": "grpo.adv_estimator.gamma: not a setting of the 'grpo' estimator (it takes "
                                     "norm_mode, epsilon)",
}


@pytest.mark.parametrize("override", list(REFUSED))
def test_an_unbuilt_setting_is_refused_by_name(override):
    cfg = load_config("grpo_tiny.yaml", ["models_dir=models", override]).config
    problems = [str(p) for p in unsupported(cfg)]
    assert any(REFUSED[override] in p for p in problems), problems
    assert not unsupported(load_config("grpo_tiny.yaml", ["models_dir=models"]).config)


def test_adam_settings_with_sgd_are_refused_at_validate():
    with pytest.raises(ConfigError, match="policy.optimizer.eps: an AdamW setting; policy.optimizer.name is sgd"):
        load_config("grpo_tiny.yaml", ["models_dir=models", "policy.optimizer.name=sgd", "policy.optimizer.eps=1e-6"])


@pytest.mark.parametrize("name,kind", [("sgd", torch.optim.SGD), ("adamw", torch.optim.AdamW)])
def test_the_named_optimizer_is_the_one_that_steps(tiny_model, single_rank_world, name, kind):
    from dockyard.policy.dtensor import DTensorPolicy

    cfg = load_config("grpo_tiny.yaml", [f"models_dir={tiny_model.parent}", f"policy.optimizer.name={name}",
                                         "policy.optimizer.lr=0.1", "policy.optimizer.weight_decay=0"]).config
    policy = DTensorPolicy(cfg, single_rank_world, torch.device("cpu"), total_optimizer_steps=1)
    assert type(policy.optimizer) is kind
    if name == "sgd":   # one step is p - lr * grad exactly
        weight = next(p for p in policy.model.parameters() if p.requires_grad)
        before = weight.detach().full_tensor().clone()
        weight.grad = torch.ones_like(weight)
        policy.optimizer.step()
        assert torch.allclose(weight.detach().full_tensor(), before - 0.1)


def test_a_misspelt_top_level_section_is_a_warning_naming_it():
    loaded = load_config("grpo_tiny.yaml", ["models_dir=models", "+grpoo.max_num_steps=3"])
    assert [str(p) for p in loaded.advice if p.path == "grpoo"] == [
        "grpoo: is not a section of the schema and no ${...} refers to it; a misspelt section? (it is ignored; "
        "did you mean 'grpo'?)"]
    referenced = load_config("grpo_tiny.yaml", ["models_dir=models", "+paths={root: /tmp/x}",
                                                "logger.log_dir=${paths.root}/logs"])
    assert not [p for p in referenced.advice if p.path == "paths"]
    assert referenced.config.logger.log_dir == "/tmp/x/logs"


def test_chat_template_path_resolves_against_the_config_folder_and_an_override_against_the_working_folder(
        tmp_path, monkeypatch):
    project = tmp_path / "project"
    (project / "templates").mkdir(parents=True)
    (project / "templates" / "chat.jinja").write_text("{{ messages[0]['content'] }}")
    (project / "my_run.yaml").write_text("defaults:\n  - grpo_tiny\n  - _self_\n"
                                         "policy:\n  generation:\n    chat_template:\n      path: templates/chat.jinja\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    cfg = load_config(str(project / "my_run.yaml"), ["models_dir=models"]).config
    assert cfg.policy.generation.chat_template.path == str(project.resolve() / "templates" / "chat.jinja")
    cfg = load_config(str(project / "my_run.yaml"), ["models_dir=models",
                                                     "policy.generation.chat_template.path=mine.jinja"]).config
    assert cfg.policy.generation.chat_template.path == str(elsewhere / "mine.jinja")


def test_log_level_reaches_the_embedded_engine_and_the_server_backends(tiny_model, tmp_path):
    import json
    import subprocess

    from dockyard.generation.client import EngineClient
    from dockyard.generation.launcher import EmbeddedServer
    from dockyard.generation.sglang import SglangServer
    from dockyard.generation.vllm import VllmServer
    from dockyard.waiting import wait_until

    cfg = load_config("grpo_tiny.yaml", [f"models_dir={tiny_model.parent}", "logger.log_level=WARNING"]).config
    assert VllmServer(cfg).environment()["VLLM_LOGGING_LEVEL"] == "WARNING"
    sglang = SglangServer(cfg).command(port=1234)
    assert sglang[sglang.index("--log-level") + 1] == "warning"
    address, log = tmp_path / "address.json", tmp_path / "engine.log"
    with open(log, "w") as handle:
        server = subprocess.Popen(EmbeddedServer(cfg).command(port=0, address_file=str(address)), stdout=handle,
                                  stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: address.is_file() or server.poll() is not None, 120, "the engine's address file")
        client = EngineClient(f"http://127.0.0.1:{json.loads(address.read_text())['port']}", log_path=log)
        client.wait_healthy(120, server)
    finally:
        server.terminate()
        server.wait(timeout=30)
    text = log.read_text()
    assert "--log-level" in EmbeddedServer(cfg).command(port=0) and " INFO " not in text, text


def _schema_fields(model, prefix=""):
    import inspect
    import typing

    from pydantic import BaseModel

    def sections(annotation):
        if inspect.isclass(annotation) and issubclass(annotation, BaseModel):
            return [annotation]
        return [m for arg in typing.get_args(annotation) for m in sections(arg)]

    for name, spec in model.model_fields.items():
        yield f"{prefix}{name}", name
        for section in sections(spec.annotation):
            yield from _schema_fields(section, f"{prefix}{name}.")


def test_every_schema_field_is_read_by_the_code_or_behind_a_refused_switch():
    """A guard against a field added to the schema and never wired: each field's name must be read
    somewhere outside the schema (an attribute or a key), or its section must sit behind a switch that
    is refused. The per-knob tests in this file and beside the features check what reading does."""
    import re
    from pathlib import Path

    from dockyard.config.schema import MasterConfig

    package = Path(__file__).resolve().parents[2] / "dockyard"
    code = "\n".join(p.read_text() for p in package.rglob("*.py") if "config/schema" not in p.as_posix())
    unread, gates = [], set()
    for path, name in _schema_fields(MasterConfig):
        if re.search(rf"(\.{re.escape(name)}\b)|([\"']{re.escape(name)}[\"'])", code):
            continue
        gate = next((prefix for prefix in GATED if path.startswith(prefix)), None)
        if gate is None:
            unread.append(path)
        else:
            gates.add(gate)
    assert not unread, f"schema fields nothing reads and no refused switch covers: {unread}"
    for gate in sorted(gates):
        override, refused_path = GATED[gate]
        try:
            problems = [str(p) for p in unsupported(load_config("grpo_tiny.yaml", ["models_dir=models",
                                                                                   *override.split()]).config)]
        except ConfigError as err:
            problems = [str(p) for p in err.problems]
        assert any(p.startswith(refused_path) for p in problems), (gate, problems)


def test_sandbox_and_environment_extras_are_checked_before_start():
    cfg = load_config("grpo_terminal_bench_local.yaml", ["models_dir=models", "+env.sandbox.memory_mbb=512",
                                                         "+env.max_output_char=100"]).config
    problems = [str(p) for p in unsupported(cfg)]
    assert any(p.startswith("env.sandbox.memory_mbb: not a sandbox setting") for p in problems), problems
    assert any(p.startswith("env.max_output_char: not a setting of the 'terminal_bench' environment") for p in problems)
    assert not unsupported(load_config("grpo_terminal_bench_local.yaml", ["models_dir=models"]).config)


@pytest.mark.parametrize("config,override,refused", [
    ("grpo_swe_local.yaml", "env.reward_mode=sometimes", "env.reward_mode: 'sometimes' is not one of binary, tests_pass"),
    ("grpo_swe_local.yaml", "+env.sandbox_urls=node3", "env.sandbox_urls: must be a list of http(s) URLs"),
    ("grpo_swe_local.yaml", "+env.tool_format=plain", "env.tool_format: a setting of the agentic swe"),
    ("grpo_swe_local.yaml", "+env.python_versions=nearest", "env.python_versions: only per-row environments read it"),
    ("grpo_program_bench_local.yaml", "env.tests_per_problem=0", "env.tests_per_problem: must be a positive"),
    ("grpo_program_bench_local.yaml", "env.language=rust", "env.language: 'rust' is not built"),
    ("gpqa_local.yaml", "env.choices_shuffle_seed=x", "env.choices_shuffle_seed: must be a whole number"),
    ("grpo_gdpval_local.yaml", "env.output_formats=[pdf]", "env.output_formats: must list formats"),
    ("grpo_gdpval_local.yaml", "env.grader=judge", "env.grader: 'judge' is not built"),
])
def test_environment_setting_values_are_refused_before_start(config, override, refused):
    """What an environment would refuse when the job builds it is refused before the queue."""
    problems = [str(p) for p in unsupported(load_config(config, ["models_dir=models", override]).config)]
    assert any(p.startswith(refused) for p in problems), problems
    assert not unsupported(load_config(config, ["models_dir=models"]).config)


def test_rollout_timeout_s_bounds_each_generation_request(engine_server, tiny_model):
    from types import SimpleNamespace

    from dockyard.generation.engine import SamplingParams
    from dockyard.generation.generator import GenerationServerError
    from dockyard.loop.grpo import GRPOTrainer

    url, _ = engine_server
    cfg = load_config("grpo_tiny.yaml", [f"models_dir={tiny_model.parent}",
                                         "grpo.sampler.rollout_timeout_s=0.001"]).config
    fleet = GRPOTrainer._fleet(SimpleNamespace(cfg=cfg), [{"url": url, "name": "rollout server 0"}])
    with pytest.raises(GenerationServerError, match=r"rollout server 0 .*did not answer /\S+ within 0 s"):
        fleet.generate([[5, 6, 7]], SamplingParams(n=4, max_tokens=64, temperature=1.0, seed=1, ignore_eos=True))
    patient = load_config("grpo_tiny.yaml", [f"models_dir={tiny_model.parent}"]).config
    fleet = GRPOTrainer._fleet(SimpleNamespace(cfg=patient), [{"url": url, "name": "rollout server 0"}])
    assert len(fleet.generate([[5, 6, 7]], SamplingParams(n=4, max_tokens=8, temperature=1.0, seed=1))) == 4


def test_context_parallel_with_shared_prompt_rows_is_refused_by_name():
    overrides = ["models_dir=models", "policy.dtensor_cfg.context_parallel_size=2",
                 "policy.dynamic_batching.enabled=true", "policy.dynamic_batching.share_prompts=true"]
    problems = [str(p) for p in unsupported(load_config("grpo_tiny.yaml", overrides).config)]
    assert problems == ["policy.dynamic_batching.share_prompts: shared-prompt rows are not built with context "
                        "parallelism (policy.dtensor_cfg.context_parallel_size > 1); turn it off"]
    assert not unsupported(load_config("grpo_tiny.yaml", overrides[:3]).config)


NON_DEFAULT = {"shuffle": "true", "num_prompts_per_step": "2", "weight": "2.0", "teacher_name": "t"}


@pytest.mark.parametrize("path", sorted(REFUSED_UNLESS_DEFAULT))
def test_a_field_accepted_only_at_its_default_is_refused_otherwise(path):
    """The fields the suite's read check excuses as REFUSED_UNLESS_DEFAULT are refused, naming the path."""
    value = NON_DEFAULT[path.rsplit(".", 1)[1]]
    try:
        load_config("grpo_math_smol.yaml", [f"{path}={value}"])
    except ConfigError as err:
        problems = [str(p) for p in err.problems]
    else:
        problems = []
    assert any(p.startswith(f"{path}: ") for p in problems), problems

