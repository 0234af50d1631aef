"""HTTP client of a generation server (the embedded engine; the routes are vLLM's / SGLang's), and
the trainer side of the weight broadcast."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Iterable

import httpx
import torch

from dockyard.distributed import dtype_name, weight_sync_group, weight_sync_store
from dockyard.generation.engine import Completion, SamplingParams


class GenerationServerError(RuntimeError):
    pass


class EngineClient:
    def __init__(self, url: str, name: str = "generation server", request_timeout_s: float = 3600,
                 log_path: str | Path | None = None):
        self.url = url.rstrip("/")
        self.name = name
        self.log_path = log_path
        self.request_timeout_s = request_timeout_s
        # A fresh connection per request: uvicorn (ours, vLLM's, SGLang's) closes a connection idle for
        # 5 s, and a request sent on a pooled one as it closes dies with 'connection reset' (seen
        # on a refit after a long training phase). A local connect costs well under a millisecond.
        self._http = httpx.Client(timeout=httpx.Timeout(request_timeout_s, connect=10),
                                  limits=httpx.Limits(max_keepalive_connections=0))
        self.last_usage: dict = {}

    def _where(self) -> str:
        return f"{self.name} at {self.url}" + (f" (log: {self.log_path})" if self.log_path else "")

    def _post(self, route: str, body: dict | None = None) -> dict:
        try:
            response = self._http.post(self.url + route, json=body or {})
        except httpx.TimeoutException:
            raise GenerationServerError(f"{self._where()} did not answer {route} within "
                                        f"{self.request_timeout_s:.0f} s") from None
        except httpx.HTTPError as err:
            raise GenerationServerError(f"{self._where()} is unreachable ({route}): {err}") from None
        if response.status_code != 200:
            raise GenerationServerError(f"{self._where()} answered {route} with {response.status_code}: "
                                        f"{response.text[:500]}")
        data = response.json()
        if data.get("success") is False:
            raise GenerationServerError(f"{self._where()} refused {route}: {data.get('message')}")
        return data

    def wait_healthy(self, timeout_s: float, process: subprocess.Popen | None = None) -> None:
        """Poll /health until it answers; fail early if the server process dies."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if process is not None and process.poll() is not None:
                raise GenerationServerError(f"{self._where()} exited with status {process.returncode} "
                                            "before it became healthy")
            try:
                if self._http.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise GenerationServerError(f"{self._where()} was not healthy after {timeout_s:.0f} s")

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Completion]:
        body = {key: value for key, value in asdict(params).items() if value is not None}
        body["prompt"] = prompts
        data = self._post("/v1/completions", body)
        self.last_usage = data.get("usage", {})
        return [Completion(c["prompt_index"], c["token_ids"], c["logprobs"]["token_logprobs"], c["finish_reason"])
                for c in data["choices"]]

    def update_weights_from_disk(self, model_path: str | Path) -> dict:
        return self._post("/update_weights_from_disk", {"model_path": str(model_path)})

    def pause(self) -> None:
        self._post("/pause_generation")

    def resume(self) -> None:
        self._post("/continue_generation")

    def abort(self) -> None:
        self._post("/abort_request", {"abort_all": True})

    def weights_version(self) -> int:
        return int(self._http.get(self.url + "/get_model_info", timeout=10).json()["weights_version"])

    def close(self) -> None:
        self._http.close()


class _Call(threading.Thread):
    """An HTTP call that must run while this process takes part in a collective."""

    def __init__(self, fn, *args):
        super().__init__(daemon=True)
        self.fn, self.args, self.result, self.error = fn, args, None, None
        self.start()

    def run(self) -> None:
        try:
            self.result = self.fn(*self.args)
        except Exception as err:  # re-raised in the caller's thread
            self.error = err

    def value(self, timeout_s: float):
        self.join(timeout_s)
        if self.is_alive():
            raise GenerationServerError(f"no answer to a weight-update call within {timeout_s:.0f} s")
        if self.error is not None:
            raise self.error
        return self.result


class WeightBroadcaster:
    """Trainer rank 0's end of SGLang's distributed weight update: one side group with the server."""

    def __init__(self, client: EngineClient, master_address: str, master_port: int,
                 group_name: str = "weight_sync", backend: str = "gloo", timeout_s: float = 300):
        self.client, self.group_name, self.timeout_s = client, group_name, timeout_s
        # master_port 0: the OS picks a free port on this node, then the server is told which
        store = weight_sync_store(master_address, master_port, 2, timeout_s)
        call = _Call(client._post, "/init_weights_update_group", {
            "master_address": master_address, "master_port": store.port, "rank_offset": 1, "world_size": 2,
            "group_name": group_name, "backend": backend})
        self.group = weight_sync_group(master_address, store.port, 0, 2, group_name, backend, timeout_s, store=store)
        call.value(timeout_s)

    def push(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        tensors = [(name, tensor.detach().contiguous()) for name, tensor in named_tensors]
        call = _Call(self.client._post, "/update_weights_from_distributed", {
            "names": [n for n, _ in tensors], "dtypes": [dtype_name(t.dtype) for _, t in tensors],
            "shapes": [list(t.shape) for _, t in tensors], "group_name": self.group_name})
        for _, tensor in tensors:
            self.group.broadcast(tensor, 0).wait()
        call.value(self.timeout_s)


class SharedMemoryWeights:
    """Trainer rank 0's weight push to an engine on the same machine: one safetensors file in shared
    memory (/dev/shm), which the engine reads through SGLang's /update_weights_from_disk. No socket
    copy: on a 2-core machine this halves the refit of a broadcast."""

    FILE = "model.safetensors"

    def __init__(self, client: EngineClient, folder: str | Path | None = None):
        import tempfile

        self.client = client
        root = Path(folder or ("/dev/shm" if Path("/dev/shm").is_dir() else tempfile.gettempdir()))
        _remove_orphans(root)
        self.folder = Path(tempfile.mkdtemp(prefix=f"dockyard-weights-{os.getpid()}-", dir=root))

    def push(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        from safetensors.torch import save_file

        # tied aliases are already left out (DTensorPolicy.serving_weights); the engine ties them
        tensors = {name: tensor.detach().contiguous() for name, tensor in named_tensors}
        partial = self.folder / (self.FILE + ".tmp")
        try:
            save_file(tensors, str(partial))
            partial.replace(self.folder / self.FILE)
        except OSError as err:
            raise GenerationServerError(f"cannot write the weights for {self.client.name} to {self.folder}: {err} "
                                        "(set policy.generation.weight_transfer: broadcast)") from None
        self.client.update_weights_from_disk(self.folder)
        (self.folder / self.FILE).unlink(missing_ok=True)  # the engine holds its own copy now

    def close(self) -> None:
        import shutil

        shutil.rmtree(self.folder, ignore_errors=True)


def _remove_orphans(root: Path) -> None:
    """Folders of trainers that were killed (SIGKILL skips the cleanup) would hold memory until reboot."""
    import shutil

    for folder in root.glob("dockyard-weights-*-*"):
        pid = folder.name.split("-")[2]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            shutil.rmtree(folder, ignore_errors=True)


def is_this_machine(host: str) -> bool:
    """Whether `host` names an address of this machine (bindable here), e.g. 127.0.0.1 or this node's name."""
    import socket

    try:
        address = socket.gethostbyname(host)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.bind((address, 0))
        return True
    except OSError:
        return False
