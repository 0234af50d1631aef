"""SWE scoring servers (`env.sandbox_urls`): the repository tests of a patch, run on other machines.

Scoring a SWE patch is CPU work (a checkout, a sandbox, the test suite) that should not compete with
the trainer's rank 0. `dockyard env serve-swe --config C` starts a server on a machine with the
sandbox backend and the repositories (a shared filesystem: the config's task files and repos_dir
must be at the same paths there); the run's `env.sandbox_urls` lists such servers, and each patch is
scored by the server with the fewest patches in flight.

The server scores only the tasks of its own config (the swe task files in its data.datasets, with
its repos_dir): a request names a task by instance_id and carries the patch and the run's reward
mode and integrity setting, never a row, a task file or a folder to read. Every /score request must
carry the run's secret (`Authorization: Bearer <secret>`), read by both sides from
`env.scoring_secret_file` (a file only its owner can read, on the shared filesystem); a request
without it is refused with 401, before anything is read.

Routes: GET /health, POST /score {"instance_id", "patch", "reward_mode", "integrity_check"} ->
{"reward", "resolved", "applied", "flagged", "log"}. An unknown task answers 404, one that cannot be
scored 422 with the reason; the client raises either, naming the server.
"""

from __future__ import annotations

import hmac
import signal
import socket
import sys
from typing import Optional

from pydantic import BaseModel

from dockyard.envs.swe import REWARD_MODES, SweScorer
from dockyard.envs.swe_environments import EnvironmentBuilder
from dockyard.envs.swe_pro import RunScripts
from dockyard.envs.swe_scoring_client import read_secret
from dockyard.envs.swe_tasks import RepoStore, SweTaskError, read_task_file
from dockyard.processes import publish_address
from dockyard.sandboxes.base import SandboxError


class ScoreRequest(BaseModel):
    instance_id: str
    patch: str
    reward_mode: str = "binary"
    integrity_check: bool = True


def build_app(sandboxes, tasks: dict, repos: RepoStore, secret: str, environments=None, run_scripts=None):
    """tasks: instance_id -> SweTask of the server's own config; only those are scored, each on its own
    environment when `environments` (swe_environments.EnvironmentBuilder: env.sandbox.task_images build)."""
    from fastapi import FastAPI, Header, HTTPException

    app = FastAPI(title="dockyard swe scoring server")
    expected = f"Bearer {secret}".encode()

    @app.get("/health")
    def health() -> dict:
        return {"status": "ok"}

    @app.post("/score")
    def score(request: ScoreRequest, authorization: Optional[str] = Header(None)) -> dict:
        # a plain def: FastAPI runs it in its thread pool
        if not hmac.compare_digest((authorization or "").encode(), expected):
            raise HTTPException(status_code=401, detail="this scoring server needs the run's secret "
                                                        "(env.scoring_secret_file)")
        if request.reward_mode not in REWARD_MODES:
            raise HTTPException(status_code=422, detail=f"reward_mode {request.reward_mode!r} is not one of "
                                                        f"{', '.join(REWARD_MODES)}")
        task = tasks.get(request.instance_id)
        if task is None:
            raise HTTPException(status_code=404, detail=f"task {request.instance_id!r} is not one of this server's "
                                                        f"{len(tasks)} tasks (its config's data.datasets)")
        scorer = SweScorer(sandboxes, repos, request.reward_mode, request.integrity_check, environments, run_scripts)
        try:
            result = scorer.score(task, request.patch)
        except (SweTaskError, SandboxError) as err:
            raise HTTPException(status_code=422, detail=str(err)) from None
        return {"reward": result.reward, "resolved": result.resolved, "applied": result.applied,
                "flagged": result.flagged, "log": result.log[-8000:]}

    return app


def server_tasks(cfg) -> tuple[dict, list[str]]:
    """instance_id -> task of every swe task file in the config's data.datasets, and the problems."""
    tasks, problems = {}, []
    for dataset in cfg.data.datasets:
        path = getattr(dataset, "path", None)
        if not path:
            continue
        found, bad = read_task_file(path)
        problems += bad
        for task in found:
            tasks.setdefault(task.instance_id, task)
    return tasks, problems


def serve(cfg, host: str, port: int, address_file: str | None) -> int:
    """`dockyard env serve-swe`: serve until stopped; 2 on a sandbox that cannot be used here."""
    import uvicorn

    from dockyard.config.schema.env import SandboxConfig
    from dockyard.sandboxes.factory import SandboxFactory

    try:
        sandboxes = SandboxFactory(cfg.env.sandbox or SandboxConfig())
        secret = read_secret((cfg.env.model_extra or {}).get("scoring_secret_file"))
        tasks, problems = server_tasks(cfg)
    except (SandboxError, ValueError) as err:
        print(f"dockyard env serve-swe: {err}", file=sys.stderr)
        return 2
    for problem in problems:
        print(f"dockyard env serve-swe: skipped: {problem}", file=sys.stderr)
    if not tasks:
        print("dockyard env serve-swe: no swe task in the config's data.datasets; nothing to score", file=sys.stderr)
        return 2
    repos = RepoStore((cfg.env.model_extra or {}).get("repos_dir"))
    environments = EnvironmentBuilder.for_config(sandboxes, repos, cfg.env)   # task_images: build, as in the run
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)   # the trainer's preemption warning, not ours
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    port = sock.getsockname()[1]
    sock.listen(128)   # connections made once the address is out wait in the backlog until uvicorn serves
    if address_file:
        publish_address(address_file, port)
    print(f"dockyard env serve-swe: scoring {len(tasks)} tasks with {sandboxes.config.type} sandboxes on {host}:{port}",
          file=sys.stderr, flush=True)
    run_scripts = RunScripts((cfg.env.model_extra or {}).get("run_scripts_dir"))   # SWE-bench Pro rows' own runners
    uvicorn.Server(uvicorn.Config(build_app(sandboxes, tasks, repos, secret, environments, run_scripts),
                                  log_level="warning")).run(sockets=[sock])
    return 0
