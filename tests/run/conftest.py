"""The tests of `dockyard run` and of what settings do to the loops."""

from datetime import timedelta

import pytest

from tests.conftest import running_engine_server
from tests.run.in_process import InProcessLoop


@pytest.fixture(scope="module")
def loop_run(tiny_model, tmp_path_factory):
    """Runs grpo_tiny (with overrides) in this process: loop_run(workdir, *overrides) -> LoopRun. One
    gloo rank and one engine server for the module."""
    import torch.distributed as dist

    from dockyard.distributed import free_port

    folder = tmp_path_factory.mktemp("loop-engine")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1,
                            timeout=timedelta(seconds=120))
    try:
        with running_engine_server(tiny_model, folder) as (url, _):
            yield InProcessLoop(tiny_model, url, folder / "engine.log")
    finally:
        dist.destroy_process_group()
