"""The embedded engine as an HTTP server process (FastAPI + uvicorn).

Routes follow the protocols real engines speak: OpenAI-style `/v1/completions` (token-id prompts,
`n`, sampling parameters, token ids and logprobs back) and SGLang's weight-update and control
routes (`/init_weights_update_group`, `/update_weights_from_distributed`, `/update_weights_from_disk`,
`/pause_generation`, `/continue_generation`, `/abort_request`).

    python -m dockyard.generation.server --model models/tiny-llama --port 8000
"""

from __future__ import annotations

import argparse
import logging
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch
import uvicorn
from fastapi import FastAPI, HTTPException
from pydantic import BaseModel, Field

from dockyard.distributed import DTYPE_NAMES, weight_sync_group
from dockyard.model_files import folder_weights
from dockyard.processes import publish_address
from dockyard.generation.engine import Completion, Engine, SamplingParams, mergeable

log = logging.getLogger("dockyard.engine")


class CompletionRequest(BaseModel):
    model: str | None = None
    prompt: list[list[int]] | list[int] = Field(..., description="token ids: one prompt or a list of prompts")
    n: int = Field(1, ge=1)
    max_tokens: int = Field(16, ge=0, description="0 with echo: prefill only (vLLM's scoring request)")
    echo: bool = False
    temperature: float = Field(1.0, ge=0, allow_inf_nan=False)
    top_p: float = Field(1.0, gt=0, le=1, allow_inf_nan=False)
    top_k: int | None = Field(None, ge=1)
    stop: list[str] | str | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    seed: int | None = None
    logprobs: int | None = None
    prompt_logprobs: int | None = Field(None, ge=0, description="vLLM's: logprobs of the prompt tokens")


class SglangSamplingParams(BaseModel):
    max_new_tokens: int = Field(128, ge=0)
    temperature: float = Field(1.0, ge=0, allow_inf_nan=False)
    top_p: float = Field(1.0, gt=0, le=1, allow_inf_nan=False)
    top_k: int = -1
    stop: list[str] | str | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    sampling_seed: int | None = None


class SglangGenerateRequest(BaseModel):
    """SGLang's native /generate (the fields dockyard uses; others are accepted and ignored here)."""
    input_ids: list[list[int]] | list[int]
    sampling_params: SglangSamplingParams = Field(default_factory=SglangSamplingParams)
    return_logprob: bool = False
    logprob_start_len: int = -1
    stream: bool = False


class DiskUpdate(BaseModel):
    model_path: str
    load_format: str | None = None


class GroupInit(BaseModel):
    master_address: str
    master_port: int
    rank_offset: int = 1
    world_size: int = 2
    group_name: str = "weight_sync"
    backend: str = "gloo"


class DistributedUpdate(BaseModel):
    names: list[str]
    dtypes: list[str]
    shapes: list[list[int]]
    group_name: str = "weight_sync"
    flush_cache: bool = True


class _Pending:
    def __init__(self, prompts: list[list[int]], params: SamplingParams):
        self.prompts, self.params = prompts, params
        self.done = threading.Event()
        self.result: list[Completion] | None = None
        self.error: Exception | None = None


class RequestBatcher:
    """Concurrent generation requests decoded together: each batch takes every waiting request that
    shares its sampling settings (an async rollout driver sends one request per prompt group; decoded
    one at a time they would run at a fraction of the batch's speed). Batches, weight updates and
    scoring take turns on `lock`."""

    def __init__(self, engine: Engine, lock: threading.Lock):
        self.engine, self.lock = engine, lock
        self._waiting: list[_Pending] = []
        self._ready = threading.Condition()
        threading.Thread(target=self._serve, name="request-batcher", daemon=True).start()

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Completion]:
        pending = _Pending(prompts, params)
        with self._ready:
            self._waiting.append(pending)
            self._ready.notify()
        pending.done.wait()
        if pending.error is not None:
            raise pending.error
        return pending.result  # type: ignore[return-value]

    def _serve(self) -> None:
        while True:
            with self._ready:
                while not self._waiting:
                    self._ready.wait()
                key = mergeable(self._waiting[0].params)
                batch = [p for p in self._waiting if mergeable(p.params) == key]
                self._waiting = [p for p in self._waiting if mergeable(p.params) != key]
            try:
                with self.lock:
                    results = self.engine.generate_many([(p.prompts, p.params) for p in batch])
                for pending, result in zip(batch, results):
                    pending.result = result
            except Exception as err:   # each caller gets the error of its batch (a bad prompt: 400)
                for pending in batch:
                    pending.error = err
            for pending in batch:
                pending.done.set()


def build_app(engine: Engine, model_name: str) -> FastAPI:
    app = FastAPI(title="dockyard embedded engine")
    lock = threading.Lock()  # one generation batch or weight update at a time
    batcher = RequestBatcher(engine, lock)
    groups: dict[str, Any] = {}

    def install(tensors: dict[str, torch.Tensor], verb: str) -> dict:
        """Load received weights into the engine; the caller holds the lock."""
        try:
            engine.load_weights(tensors)
        except ValueError as err:
            return {"success": False, "message": str(err)}
        return {"success": True, "message": f"{verb} {len(tensors)} tensors", "weights_version": engine.weights_version}

    @app.get("/health")
    def health() -> dict:
        return {"status": "ok", "paused": engine.paused}

    @app.get("/get_model_info")
    def model_info() -> dict:
        return {"model_path": model_name, "weights_version": engine.weights_version}

    @app.post("/v1/completions")
    def completions(request: CompletionRequest) -> dict:
        prompts = request.prompt if request.prompt and isinstance(request.prompt[0], list) else [request.prompt]
        stops = [request.stop] if isinstance(request.stop, str) else list(request.stop or [])
        params = SamplingParams(n=request.n, max_tokens=request.max_tokens, temperature=request.temperature,
                                top_p=request.top_p, top_k=request.top_k, stop=stops,
                                stop_token_ids=list(request.stop_token_ids or []), ignore_eos=request.ignore_eos,
                                seed=request.seed)
        if request.max_tokens == 0 and not (request.echo and request.prompt_logprobs is not None):
            raise HTTPException(status_code=400, detail="max_tokens 0 is a scoring request: it needs echo and "
                                                        "prompt_logprobs")
        started = time.perf_counter()
        try:
            # as vLLM: echo with max_tokens 0 scores the prompts and generates nothing
            completions = [Completion(index, [], [], "length") for index in range(len(prompts))] \
                if request.max_tokens == 0 else batcher.generate(prompts, params)
            scored = None
            if request.prompt_logprobs is not None:
                with lock:
                    scored = engine.score(prompts)
        except ValueError as err:
            raise HTTPException(status_code=400, detail=str(err)) from None
        elapsed = time.perf_counter() - started
        generated = sum(len(c.token_ids) for c in completions)
        return {
            "id": f"cmpl-{time.time_ns()}", "object": "text_completion", "created": int(time.time()),
            "model": model_name, "weights_version": engine.weights_version,
            "choices": [{"index": i, "prompt_index": c.prompt_index, "token_ids": c.token_ids,
                         "text": engine.tokenizer.decode(c.token_ids, skip_special_tokens=True),
                         "logprobs": {"token_logprobs": c.logprobs}, "finish_reason": c.finish_reason,
                         "prompt_logprobs": None if scored is None else _vllm_prompt_logprobs(
                             prompts[c.prompt_index], scored[c.prompt_index])}
                        for i, c in enumerate(completions)],
            "usage": {"prompt_tokens": sum(len(p) for p in prompts) * request.n, "completion_tokens": generated,
                      "generation_seconds": elapsed},
        }

    @app.post("/generate")
    def generate(request: SglangGenerateRequest) -> list[dict] | dict:
        single = not (request.input_ids and isinstance(request.input_ids[0], list))
        prompts = [request.input_ids] if single else request.input_ids
        sp = request.sampling_params
        if request.stream:
            raise HTTPException(status_code=400, detail="stream is not supported by the embedded engine")
        stops = [sp.stop] if isinstance(sp.stop, str) else list(sp.stop or [])
        params = SamplingParams(n=1, max_tokens=max(1, sp.max_new_tokens), temperature=sp.temperature,
                                top_p=sp.top_p, top_k=sp.top_k if sp.top_k > 0 else None, stop=stops,
                                stop_token_ids=list(sp.stop_token_ids or []), ignore_eos=sp.ignore_eos,
                                seed=sp.sampling_seed)
        try:
            completions = batcher.generate(prompts, params) if sp.max_new_tokens > 0 else []
            scored = None
            if request.return_logprob and request.logprob_start_len >= 0:
                with lock:
                    scored = engine.score(prompts)
        except ValueError as err:
            raise HTTPException(status_code=400, detail=str(err)) from None
        answers = []
        for index, prompt in enumerate(prompts):
            c = completions[index] if completions else None
            meta = {"id": f"gen-{time.time_ns()}-{index}", "prompt_tokens": len(prompt),
                    "completion_tokens": len(c.token_ids) if c else 0,
                    "finish_reason": {"type": c.finish_reason if c else "length"}, "weights_version": engine.weights_version}
            if request.return_logprob:
                meta["output_token_logprobs"] = [[lp, t, None] for lp, t in zip(c.logprobs, c.token_ids)] if c else []
                if scored is not None:
                    start = request.logprob_start_len
                    meta["input_token_logprobs"] = [[None if t == 0 else scored[index][t - 1], prompt[t], None]
                                                    for t in range(start, len(prompt))]
            answers.append({"text": engine.tokenizer.decode(c.token_ids, skip_special_tokens=True) if c else "",
                            "output_ids": c.token_ids if c else [], "meta_info": meta})
        return answers[0] if single else answers

    @app.post("/update_weights_from_disk")
    def update_from_disk(request: DiskUpdate) -> dict:
        tensors = folder_weights(Path(request.model_path))
        if not tensors:
            return {"success": False, "message": f"no .safetensors files in {request.model_path}"}
        with lock:
            return install(tensors, "loaded")

    @app.post("/init_weights_update_group")
    def init_group(request: GroupInit) -> dict:
        try:
            groups[request.group_name] = weight_sync_group(
                request.master_address, request.master_port, request.rank_offset, request.world_size,
                request.group_name, request.backend)
        except Exception as err:  # a peer that never joins surfaces here as a timeout
            return {"success": False, "message": f"{type(err).__name__}: {err}"}
        return {"success": True, "message": f"joined {request.group_name} as rank {request.rank_offset}"}

    @app.post("/update_weights_from_distributed")
    def update_from_distributed(request: DistributedUpdate) -> dict:
        group = groups.get(request.group_name)
        if group is None:
            return {"success": False, "message": f"no weight update group {request.group_name!r}; "
                    "call /init_weights_update_group first"}
        if not len(request.names) == len(request.dtypes) == len(request.shapes):
            return {"success": False, "message": "names, dtypes and shapes must have the same length"}
        with lock:
            tensors = {}
            for name, dtype, shape in zip(request.names, request.dtypes, request.shapes):
                tensor = torch.empty(shape, dtype=DTYPE_NAMES[dtype])
                group.broadcast(tensor, 0).wait()
                tensors[name] = tensor
            return install(tensors, "updated")

    @app.post("/pause_generation")
    def pause() -> dict:
        engine.pause()
        return {"success": True}

    @app.post("/continue_generation")
    def resume() -> dict:
        engine.resume()
        return {"success": True}

    @app.post("/abort_request")
    def abort() -> dict:
        engine.abort()
        return {"success": True}

    return app


def _vllm_prompt_logprobs(prompt: list[int], scored: list[float]) -> list[dict | None]:
    """vLLM's prompt_logprobs layout: None for the first token, then {"<id>": {"logprob": x}}."""
    return [None] + [{str(token): {"logprob": lp, "rank": None, "decoded_token": None}}
                     for token, lp in zip(prompt[1:], scored)]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description="dockyard embedded generation server")
    parser.add_argument("--model", required=True, help="local transformers folder")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000, help="0 picks a free port (see --address-file)")
    parser.add_argument("--address-file", help="write {host, port} here once listening (the Slurm driver "
                        "reads it: a port picked by the server cannot collide with another job's)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", choices=["fp32", "bf16", "fp16"], default="fp32")
    parser.add_argument("--max-batch-size", type=int, default=64)
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"],
                        help="logger.log_level")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s engine %(levelname)s %(message)s")
    if args.threads:
        torch.set_num_threads(args.threads)
    from dockyard.models import DTYPES, ModelLoadError, ModelNotFoundError

    # USR2 is the Slurm warning / preemption signal meant for the trainer (it checkpoints); a server
    # must outlive it so the trainer can finish its step and save.
    signal.signal(signal.SIGUSR2, lambda *_: log.info("USR2 received (the trainer handles it); serving on"))
    try:
        engine = Engine(args.model, device=args.device, dtype=DTYPES[args.dtype], max_batch_size=args.max_batch_size)
    except (ModelLoadError, ModelNotFoundError) as err:
        print(f"dockyard engine: model error: {err}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((args.host, args.port))
    port = sock.getsockname()[1]
    log.info("model %s loaded; serving on %s:%d", args.model, args.host, port)
    server = uvicorn.Server(uvicorn.Config(build_app(engine, args.model), log_level="warning"))
    if args.address_file:
        publish_address(args.address_file, port)
    server.run(sockets=[sock])


if __name__ == "__main__":
    main()
