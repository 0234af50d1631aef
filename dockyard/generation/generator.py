"""The Generator interface the loops talk to, and the HTTP plumbing its server clients share.

A Generator is one generation server (a replica) seen from the trainer: token ids in, token ids and
per-token logprobs out, prefill-only scoring, the refit primitives, and pause / resume / abort /
health. The embedded engine, vLLM and SGLang each implement it over their own HTTP protocol
(client.py, vllm.py, sglang.py); `GeneratorFleet` (fleet.py) implements it over several replicas,
so a loop never knows which backend or how many servers it drives.

Logprobs: every backend returns the logprob of each sampled token under the distribution it sampled
from (logits / temperature; top-k / top-p only restrict what may be sampled). That is what the
trainer recomputes and what IS correction compares against; vLLM is started with
`--logprobs-mode processed_logprobs` for it (its default, raw logprobs, ignores the temperature).
`score` returns raw logprobs (temperature 1) of given tokens.

Images: `generate` takes each prompt's images beside its token ids. They pass the multimodal gate
(images.py) first, whatever the backend; a backend that cannot forward them says so.
"""

from __future__ import annotations

import abc
import subprocess
import time
from pathlib import Path

import httpx

from dockyard.errors import ComponentError
from dockyard.generation.engine import Completion, SamplingParams
from dockyard.generation.images import ImageGate, ImageSource


class GenerationServerError(ComponentError, RuntimeError):
    pass


class Generator(abc.ABC):
    name: str
    image_gate: ImageGate = ImageGate()   # closed unless the config opens it

    @abc.abstractmethod
    def generate(self, prompts: list[list[int]], params: SamplingParams,
                 images: list[list[ImageSource]] | None = None) -> list[Completion]:
        """params.n samples of each prompt; Completion.prompt_index says which prompt. `images`, when
        given, holds one list per prompt: the images its placeholder tokens stand for."""

    @abc.abstractmethod
    def score(self, sequences: list[list[int]], starts: list[int]) -> list[list[float]]:
        """Prefill only: logprob of sequence[i][t] given sequence[i][:t] for t >= starts[i] (no sampling)."""

    @abc.abstractmethod
    def pause(self) -> None:
        """In-flight requests hold (keeping their tokens) until resume()."""

    @abc.abstractmethod
    def resume(self) -> None: ...

    @abc.abstractmethod
    def abort(self) -> None:
        """In-flight requests end now, returning what they sampled so far."""

    @abc.abstractmethod
    def healthy(self) -> bool: ...

    # --- refit primitives (trainer rank 0 drives them; see weight_transfer.py) ------------------

    @abc.abstractmethod
    def load_weights_from_disk(self, folder: str | Path) -> None:
        """Replace the served weights with the safetensors files in `folder` (same machine or shared FS)."""

    @abc.abstractmethod
    def join_weight_group(self, master_address: str, master_port: int, rank: int, world_size: int,
                          group_name: str, backend: str) -> None:
        """Join trainer rank 0's torch.distributed group for broadcast refits (blocks until all joined)."""

    @abc.abstractmethod
    def receive_weights(self, group_name: str, names: list[str], dtypes: list[str],
                        shapes: list[list[int]]) -> None:
        """Receive one broadcast per tensor, in this order, and serve them (blocks until done)."""

    def close(self) -> None:
        pass


class ServerClient:
    """HTTP to one server: errors name the server, its URL and its log."""

    def __init__(self, url: str, name: str = "generation server", request_timeout_s: float = 3600,
                 log_path: str | Path | None = None, image_gate: ImageGate | None = None):
        self.url = url.rstrip("/")
        if image_gate is not None:
            self.image_gate = image_gate
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

    def _request(self, method: str, route: str, body: dict | None = None, params: dict | None = None,
                 timeout_s: float | None = None) -> dict:
        timeout = self.request_timeout_s if timeout_s is None else timeout_s
        try:
            response = self._http.request(method, self.url + route, json=body, params=params,
                                          timeout=httpx.Timeout(timeout, connect=10))
        except httpx.TimeoutException:
            raise GenerationServerError(f"{self._where()} did not answer {route} within {timeout:.0f} s") from None
        except httpx.HTTPError as err:
            raise GenerationServerError(f"{self._where()} is unreachable ({route}): {err}") from None
        if response.status_code != 200:
            raise GenerationServerError(f"{self._where()} answered {route} with {response.status_code}: "
                                        f"{response.text[:500]}")
        if not response.content:
            return {}
        data = response.json()
        if isinstance(data, dict) and data.get("success") is False:
            raise GenerationServerError(f"{self._where()} refused {route}: {data.get('message')}")
        return data

    def _post(self, route: str, body: dict | None = None, params: dict | None = None,
              timeout_s: float | None = None) -> dict:
        return self._request("POST", route, body or {}, params, timeout_s)

    def _get(self, route: str, timeout_s: float | None = None) -> dict:
        return self._request("GET", route, None, None, timeout_s)

    def healthy(self) -> bool:
        try:
            return self._http.get(self.url + "/health", timeout=5).status_code == 200
        except httpx.HTTPError:
            return False

    def wait_healthy(self, timeout_s: float, process: subprocess.Popen | None = None) -> None:
        """Poll /health until it answers; fail early if the server process dies."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if process is not None and process.poll() is not None:
                raise GenerationServerError(f"{self._where()} exited with status {process.returncode} "
                                            "before it became healthy")
            if self.healthy():
                return
            time.sleep(0.2)
        raise GenerationServerError(f"{self._where()} was not healthy after {timeout_s:.0f} s")

    def close(self) -> None:
        self._http.close()
