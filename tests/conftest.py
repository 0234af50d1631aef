import subprocess
import sys
from pathlib import Path

import pytest

from dockyard.config import ConfigError, load_config

REPO = Path(__file__).resolve().parent.parent


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


@pytest.fixture(scope="module")
def engine_server(tiny_model, tmp_path_factory):
    """A real embedded-engine HTTP server process on a free port; yields (url, process)."""
    from dockyard.distributed import free_port
    from dockyard.generation.client import EngineClient

    port = free_port()
    log = tmp_path_factory.mktemp("engine") / "engine.log"
    with open(log, "w") as handle:
        process = subprocess.Popen([sys.executable, "-m", "dockyard.generation.server", "--model", str(tiny_model),
                                    "--port", str(port), "--threads", "1"], stdout=handle, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        EngineClient(url, log_path=log).wait_healthy(120, process)
        yield url, process
    finally:
        process.terminate()
        process.wait(timeout=30)


@pytest.fixture
def single_rank_world():
    """A one-rank gloo world in this process (FSDP2 needs a process group even for one rank)."""
    from datetime import timedelta

    import torch.distributed as dist

    from dockyard.distributed import WorldInfo, free_port

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1,
                            timeout=timedelta(seconds=60))
    yield WorldInfo(0, 1, 0)
    dist.destroy_process_group()
