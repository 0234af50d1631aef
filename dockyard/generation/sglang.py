"""The SGLang backend: how a replica's server is started (`python -m sglang.launch_server`), and its
Generator client over SGLang's native HTTP API:

- `/generate` with `input_ids`, `sampling_params` and `return_logprob` (a group's n samples are sent
  as n copies of the prompt in one batch: SGLang's radix cache prefills the shared prompt once);
  sampled tokens and logprobs from `meta_info.output_token_logprobs`, scores from
  `meta_info.input_token_logprobs` with `max_new_tokens: 0`;
- the weight routes `/update_weights_from_disk`, `/init_weights_update_group`,
  `/update_weights_from_distributed`, and `/pause_generation`, `/continue_generation`, `/abort_request`.

SGLang needs CUDA; on machines without GPUs the client is tested against dockyard's embedded engine,
which serves the same routes. Image inputs pass the same gate and are then an explicit error: this
client does not forward them yet, and configs that turn them on are refused at validate time.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from dockyard.config.schema import MasterConfig
from dockyard.generation.client import EngineClient
from dockyard.generation.engine import Completion, SamplingParams
from dockyard.generation.generator import GenerationServerError
from dockyard.generation.images import ImageGate, ImageSource

DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


class SglangServer:
    def __init__(self, config: MasterConfig, model_path: str | None = None, tensor_parallel_size: int | None = None):
        # model_path / tensor_parallel_size: a teacher server (on_policy_distillation) serves its own model
        self.config, self.model_path, self.tensor_parallel_size = \
            config, model_path or config.policy.model_name, tensor_parallel_size

    def command(self, port: int, host: str = "127.0.0.1", threads: int = 0, address_file: str | None = None) -> list[str]:
        gen = self.config.policy.generation
        sg = gen.sglang_cfg
        sampling = {"temperature": gen.temperature, "top_p": gen.top_p, "eval_temperature": gen.eval_temperature}
        wrapper = [sys.executable, "-m", "dockyard.generation.sglang_serve", "--sampling", json.dumps(sampling)]
        if address_file:
            wrapper += ["--address-file", address_file]
        args = ["--model-path", self.model_path, "--host", host, "--port", str(port),
                "--tp-size", str(self.tensor_parallel_size or sg.tensor_parallel_size), "--mem-fraction-static", str(sg.mem_fraction_static),
                "--load-format", sg.load_format, "--dtype", DTYPES[self.config.policy.precision],
                "--random-seed", str(self.config.policy.seed), "--log-level", self.config.logger.log_level.lower(),
                "--context-length", str(self.config.policy.max_total_sequence_length)]
        if sg.disable_cuda_graph:
            args.append("--disable-cuda-graph")
        for key, value in (sg.model_extra or {}).items():
            flag = "--" + key.replace("_", "-")
            if value is True:
                args.append(flag)
            elif isinstance(value, (dict, list)):
                args += [flag, json.dumps(value)]
            elif value not in (None, False):
                args += [flag, str(value)]
        return wrapper + ["--", *args]

    def environment(self, cpus: str | None = None) -> dict[str, str]:
        return dict(self.config.policy.generation.sglang_cfg.env_vars)

    def client(self, url: str, name: str, log_path: str | Path | None = None,
               request_timeout_s: float = 3600) -> "SglangClient":
        return SglangClient(url, name=name, log_path=log_path, request_timeout_s=request_timeout_s,
                            image_gate=ImageGate.from_generation(self.config.policy.generation))


class SglangClient(EngineClient):
    """Generation and scoring through `/generate`; control and refit through the routes EngineClient speaks."""

    def generate(self, prompts: list[list[int]], params: SamplingParams,
                 images: list[list[ImageSource]] | None = None) -> list[Completion]:
        if self.image_gate.admit(images, len(prompts)):
            raise GenerationServerError(f"{self._where()}: the sglang backend does not forward images yet; "
                                        "image inputs need policy.generation.backend=vllm")
        sampling = {"max_new_tokens": params.max_tokens, "temperature": params.temperature, "top_p": params.top_p,
                    "top_k": params.top_k or -1, "stop": params.stop, "stop_token_ids": params.stop_token_ids,
                    "ignore_eos": params.ignore_eos}
        if params.seed is not None:
            sampling["sampling_seed"] = params.seed
        batch = [prompt for prompt in prompts for _ in range(params.n)]
        started = time.perf_counter()
        answers = self._post("/generate", {"input_ids": batch, "sampling_params": sampling, "return_logprob": True})
        elapsed = time.perf_counter() - started
        if not isinstance(answers, list) or len(answers) != len(batch):
            raise GenerationServerError(f"{self._where()} answered /generate with {type(answers).__name__} "
                                        f"for {len(batch)} inputs")
        out = []
        for index, answer in enumerate(answers):
            meta = answer["meta_info"]
            pairs = meta.get("output_token_logprobs") or []
            reason = (meta.get("finish_reason") or {}).get("type", "abort")
            out.append(Completion(index // params.n, [int(p[1]) for p in pairs], [float(p[0]) for p in pairs],
                                  reason if reason in ("stop", "length") else "abort"))
        self.last_usage = {"completion_tokens": sum(len(c.token_ids) for c in out), "generation_seconds": elapsed}
        return out

    def score(self, sequences: list[list[int]], starts: list[int]) -> list[list[float]]:
        answers = self._post("/generate", {"input_ids": sequences, "return_logprob": True, "logprob_start_len": 0,
                                           "sampling_params": {"max_new_tokens": 0, "temperature": 0}})
        scores = []
        for sequence, start, answer in zip(sequences, starts, answers):
            entries = answer["meta_info"]["input_token_logprobs"]
            if start < 1:
                raise ValueError("scoring starts at position 1 or later (the first token has no logprob)")
            scores.append([float(entries[t][0]) for t in range(start, len(sequence))])
        return scores
