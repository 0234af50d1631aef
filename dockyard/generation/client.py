"""The embedded engine's client: the Generator interface over dockyard's own server
(OpenAI-style `/v1/completions` with token ids, SGLang's weight-update and control routes)."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from dockyard.generation.engine import Completion, SamplingParams
from dockyard.generation.generator import GenerationServerError, Generator, ServerClient
from dockyard.generation.images import ImageSource

__all__ = ["EngineClient", "GenerationServerError"]


class EngineClient(ServerClient, Generator):
    def generate(self, prompts: list[list[int]], params: SamplingParams,
                 images: list[list[ImageSource]] | None = None) -> list[Completion]:
        if self.image_gate.admit(images, len(prompts)):
            raise GenerationServerError(f"{self._where()} is the embedded engine, which serves text-only models; "
                                        "image inputs need policy.generation.backend=vllm")
        body = {key: value for key, value in asdict(params).items() if value is not None}
        body["prompt"] = prompts
        data = self._post("/v1/completions", body)
        self.last_usage = data.get("usage", {})
        return [Completion(c["prompt_index"], c["token_ids"], c["logprobs"]["token_logprobs"], c["finish_reason"])
                for c in data["choices"]]

    def score(self, sequences: list[list[int]], starts: list[int]) -> list[list[float]]:
        data = self._post("/v1/completions", {"prompt": sequences, "max_tokens": 0, "echo": True, "temperature": 0,
                                              "prompt_logprobs": 0})
        return [prompt_logprobs_from(sequence, choice["prompt_logprobs"], start)
                for sequence, choice, start in zip(sequences, data["choices"], starts)]

    # --- control (SGLang's routes) -----------------------------------------------------------

    def pause(self) -> None:
        self._post("/pause_generation")

    def resume(self) -> None:
        self._post("/continue_generation")

    def abort(self) -> None:
        self._post("/abort_request", {"abort_all": True})

    def weights_version(self) -> int:
        return int(self._get("/get_model_info", timeout_s=10)["weights_version"])

    # --- refit (SGLang's routes) -------------------------------------------------------------

    def load_weights_from_disk(self, folder: str | Path) -> None:
        self._post("/update_weights_from_disk", {"model_path": str(folder)})

    def join_weight_group(self, master_address: str, master_port: int, rank: int, world_size: int,
                          group_name: str, backend: str) -> None:
        self._post("/init_weights_update_group", {
            "master_address": master_address, "master_port": master_port, "rank_offset": rank,
            "world_size": world_size, "group_name": group_name, "backend": backend})

    def receive_weights(self, group_name: str, names: list[str], dtypes: list[str],
                        shapes: list[list[int]]) -> None:
        self._post("/update_weights_from_distributed", {"names": names, "dtypes": dtypes, "shapes": shapes,
                                                         "group_name": group_name})


def prompt_logprobs_from(sequence: list[int], entries: list, start: int) -> list[float]:
    """Logprobs of sequence[t] for t >= start from vLLM's prompt_logprobs list (None at position 0;
    each entry maps "<token id>" to {"logprob": ...} and always holds the given token)."""
    if start < 1:
        raise ValueError("scoring starts at position 1 or later (the first token has no logprob)")
    return [float(entries[t][str(sequence[t])]["logprob"]) for t in range(start, len(sequence))]
