"""SWE scoring servers (`env.sandbox_urls`): the repository tests of a patch, run on other machines.

Scoring a SWE patch is CPU work (a checkout, a sandbox, the test suite) that should not compete with
the trainer's rank 0. `dockyard env serve-swe --config C` starts a server on a machine with the
sandbox backend and the repositories (a shared filesystem: repos_dir and the task files must be at
the same paths there); the run's `env.sandbox_urls` lists such servers, and each patch is scored by the
server with the fewest patches in flight. The request carries the row and the run's reward mode and
integrity setting, so a server serves any run; the answer is the scorer's result.

Routes: GET /health, POST /score {"row", "task_file", "patch", "reward_mode", "integrity_check",
"repos_dir"} -> {"reward", "resolved", "applied", "flagged", "log"}. A task that cannot be scored
answers 422 with the reason; the client raises it, naming the server.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import threading
from pathlib import Path
from typing import Optional

import httpx
from pydantic import BaseModel

from dockyard.envs.swe_tasks import RepoStore, SweTaskError, task_from_row
from dockyard.sandboxes.base import SandboxError


class ScoringServerError(RuntimeError):
    """A scoring server did not answer, or answered with an error; the message names it."""


class RemoteScorers:
    """Sends each patch to the least-busy server of env.sandbox_urls."""

    def __init__(self, urls: list[str], timeout_s: float):
        self.urls = [url.rstrip("/") for url in urls]
        self.timeout_s = timeout_s
        self.in_flight = {url: 0 for url in self.urls}
        self._lock = threading.Lock()

    def score(self, request: dict) -> dict:
        with self._lock:
            url = min(self.urls, key=lambda u: self.in_flight[u])
            self.in_flight[url] += 1
        try:
            response = httpx.post(f"{url}/score", json=request, timeout=self.timeout_s)
        except httpx.HTTPError as err:
            raise ScoringServerError(f"scoring server {url} (env.sandbox_urls) did not answer /score: "
                                     f"{type(err).__name__}: {err}") from None
        finally:
            with self._lock:
                self.in_flight[url] -= 1
        if response.status_code == 422:
            raise SweTaskError(f"scoring server {url}: {response.json().get('detail')}")
        if response.status_code != 200:
            raise ScoringServerError(f"scoring server {url} answered /score with {response.status_code}: "
                                     f"{response.text[:300]}")
        return response.json()


class ScoreRequest(BaseModel):
    row: dict
    task_file: str
    patch: str
    reward_mode: str = "binary"
    integrity_check: bool = True
    repos_dir: Optional[str] = None


def build_app(sandboxes):
    from fastapi import FastAPI, HTTPException

    from dockyard.envs.swe import REWARD_MODES, SweScorer

    app = FastAPI(title="dockyard swe scoring server")
    stores: dict[str | None, RepoStore] = {}
    lock = threading.Lock()

    @app.get("/health")
    def health() -> dict:
        return {"status": "ok"}

    @app.post("/score")
    def score(request: ScoreRequest) -> dict:   # a plain def: FastAPI runs it in its thread pool
        if request.reward_mode not in REWARD_MODES:
            raise HTTPException(status_code=422, detail=f"reward_mode {request.reward_mode!r} is not one of "
                                                        f"{', '.join(REWARD_MODES)}")
        with lock:
            if request.repos_dir not in stores:
                stores[request.repos_dir] = RepoStore(request.repos_dir)
            store = stores[request.repos_dir]
        scorer = SweScorer(sandboxes, store, request.reward_mode, request.integrity_check)
        try:
            result = scorer.score(task_from_row(request.row, request.task_file), request.patch)
        except (SweTaskError, SandboxError) as err:
            raise HTTPException(status_code=422, detail=str(err)) from None
        return {"reward": result.reward, "resolved": result.resolved, "applied": result.applied,
                "flagged": result.flagged, "log": result.log[-8000:]}

    return app


def serve(cfg, host: str, port: int, address_file: str | None) -> int:
    """`dockyard env serve-swe`: serve until stopped; 2 on a sandbox that cannot be used here."""
    import uvicorn

    from dockyard.config.schema.env import SandboxConfig
    from dockyard.sandboxes.factory import SandboxFactory

    try:
        sandboxes = SandboxFactory(cfg.env.sandbox or SandboxConfig())
    except SandboxError as err:
        print(f"dockyard env serve-swe: {err}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)   # the trainer's preemption warning, not ours
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    port = sock.getsockname()[1]
    sock.listen(128)   # connections made once the address is out wait in the backlog until uvicorn serves
    if address_file:
        target = Path(address_file)
        tmp = target.with_name(target.name + ".tmp")
        tmp.write_text(json.dumps({"host": socket.gethostname(), "port": port, "pid": os.getpid()}))
        os.replace(tmp, target)
    print(f"dockyard env serve-swe: scoring with {sandboxes.config.type} sandboxes on {host}:{port}",
          file=sys.stderr, flush=True)
    uvicorn.Server(uvicorn.Config(build_app(sandboxes), log_level="warning")).run(sockets=[sock])
    return 0
