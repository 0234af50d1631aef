"""Settings the schema accepts either take effect or are refused by name before anything starts."""

import pytest
import torch

from dockyard.config import ConfigError, load_config
from dockyard.loop.support import unsupported

REFUSED = {
    "data.datasets.0.buffer_replay_strategy=lifo": "data.datasets[0].buffer_replay_strategy: the GRPO loops carry "
                                                   "no buffer",
    "policy.generation.router.port=8123": "policy.generation.router.port: there is no router process",
    "policy.generation.router.max_connections=4": "policy.generation.router.max_connections: there is no router",
    "logger.gpu_monitoring_interval_s=2": "logger.gpu_monitoring_interval_s: GPU figures are sampled once per step",
    "policy.dtensor_cfg.cpu_offload=true": "policy.dtensor_cfg.cpu_offload: the trainer runs on CPU",
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
