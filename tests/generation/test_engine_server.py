"""The embedded engine over real HTTP: sampling, logprobs, weight updates, pause/resume."""

import threading
import time

import httpx
import pytest
import torch
from safetensors.torch import save_file

from dockyard.distributed import free_port
from dockyard.generation.client import EngineClient, GenerationServerError
from dockyard.generation.weight_transfer import SharedMemoryWeights, WeightBroadcaster, is_this_machine
from dockyard.generation.engine import SamplingParams
from dockyard.models import load_causal_lm

PROMPTS = [[2, 311, 282, 266, 279], [2, 18, 19]]


@pytest.fixture(scope="module")
def client(engine_server):
    url, _ = engine_server
    return EngineClient(url)


def forward_logprobs(model, prompt, completion, temperature=1.0):
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1:-1] / temperature
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(completion)[:, None])[:, 0]


def test_n_samples_per_prompt_with_logprobs_that_match_a_forward_pass(client, tiny_model):
    out = client.generate(PROMPTS, SamplingParams(n=3, max_tokens=10, temperature=0.7, seed=1))
    assert [c.prompt_index for c in out] == [0, 0, 0, 1, 1, 1]
    model = load_causal_lm(tiny_model)
    for c in out:
        assert 1 <= len(c.token_ids) <= 10 and len(c.logprobs) == len(c.token_ids)
        expected = forward_logprobs(model, PROMPTS[c.prompt_index], c.token_ids, temperature=0.7)
        assert torch.allclose(torch.tensor(c.logprobs), expected, atol=1e-4)
    assert len({tuple(c.token_ids) for c in out[:3]}) > 1  # sampling, not greedy


def test_same_seed_same_samples_and_top_k_1_is_greedy(client):
    params = SamplingParams(n=2, max_tokens=8, temperature=1.0, seed=5)
    first = [c.token_ids for c in client.generate(PROMPTS, params)]
    assert first == [c.token_ids for c in client.generate(PROMPTS, params)]
    greedy = client.generate(PROMPTS, SamplingParams(n=1, max_tokens=8, temperature=0.0))
    top1 = client.generate(PROMPTS, SamplingParams(n=1, max_tokens=8, temperature=1.0, top_k=1, seed=9))
    assert [c.token_ids for c in greedy] == [c.token_ids for c in top1]


def test_stop_token_ids_and_length(client):
    greedy = client.generate([PROMPTS[0]], SamplingParams(max_tokens=8, temperature=0.0))[0]
    stop_at = greedy.token_ids[2]
    stopped = client.generate([PROMPTS[0]], SamplingParams(max_tokens=8, temperature=0.0,
                                                            stop_token_ids=[stop_at]))[0]
    assert stopped.token_ids == greedy.token_ids[:greedy.token_ids.index(stop_at) + 1]
    assert stopped.finish_reason == "stop"
    assert greedy.finish_reason in ("length", "stop")
    long = client.generate([PROMPTS[0]], SamplingParams(max_tokens=12, temperature=1.0, ignore_eos=True, seed=3))[0]
    assert len(long.token_ids) == 12 and long.finish_reason == "length"


def test_invalid_requests_are_refused(engine_server):
    url, _ = engine_server
    assert httpx.post(url + "/v1/completions", json={"prompt": [[1, 2]], "temperature": "nan"}).status_code == 422
    assert httpx.post(url + "/v1/completions", json={"prompt": [[]]}).status_code == 400


def test_pause_holds_generation_until_continue(client):
    client.pause()
    result = {}
    worker = threading.Thread(target=lambda: result.update(
        out=client.generate([PROMPTS[1]], SamplingParams(max_tokens=4, temperature=0.0))))
    worker.start()
    time.sleep(1.0)
    assert worker.is_alive() and "out" not in result
    client.resume()
    worker.join(timeout=30)
    assert len(result["out"][0].token_ids) >= 1


def test_update_weights_from_disk_and_by_broadcast(client, tiny_model, tmp_path):
    model = load_causal_lm(tiny_model)
    state = {k: v.clone().contiguous() for k, v in model.state_dict().items()}
    state["lm_head.weight"].zero_()  # uniform next-token distribution
    save_file(state, str(tmp_path / "model.safetensors"))
    before = client.weights_version()
    client.load_weights_from_disk(tmp_path)
    uniform = client.generate([PROMPTS[0]], SamplingParams(max_tokens=3, temperature=1.0, seed=0))[0]
    assert client.weights_version() == before + 1
    assert all(abs(lp + torch.log(torch.tensor(512.0)).item()) < 1e-4 for lp in uniform.logprobs)

    broadcaster = WeightBroadcaster([client], "127.0.0.1", free_port())
    broadcaster.push(model.state_dict().items())  # back to the original weights
    restored = client.generate([PROMPTS[0]], SamplingParams(max_tokens=3, temperature=0.0))[0]
    expected = forward_logprobs(model, PROMPTS[0], restored.token_ids)
    assert torch.allclose(torch.tensor(restored.logprobs), expected, atol=1e-4)


def test_shared_memory_weights_reach_the_engine_and_leave_nothing_behind(client, tiny_model):
    import os
    from pathlib import Path

    orphan, alive = Path("/dev/shm/dockyard-weights-999999999-x"), Path(f"/dev/shm/dockyard-weights-{os.getpid()}-y")
    orphan.mkdir(exist_ok=True)
    alive.mkdir(exist_ok=True)
    model = load_causal_lm(tiny_model)
    changed = {k: v.clone() for k, v in model.state_dict().items()}
    changed["lm_head.weight"].zero_()
    sender = SharedMemoryWeights([client])
    assert str(sender.folder).startswith("/dev/shm/")
    assert not orphan.exists() and alive.exists()   # a killed trainer's folder goes, a living one's stays
    alive.rmdir()
    before = client.weights_version()
    sender.push(changed.items())
    assert client.weights_version() == before + 1
    uniform = client.generate([PROMPTS[0]], SamplingParams(max_tokens=3, temperature=1.0, seed=0))[0]
    assert all(abs(lp + torch.log(torch.tensor(512.0)).item()) < 1e-4 for lp in uniform.logprobs)
    # tensors sharing storage (tied weights in fp32) are written once
    state = model.state_dict()
    sender.push(list(state.items()) + [("lm_head.weight", state["lm_head.weight"])])
    restored = client.generate([PROMPTS[0]], SamplingParams(max_tokens=3, temperature=0.0))[0]
    assert torch.allclose(torch.tensor(restored.logprobs), forward_logprobs(model, PROMPTS[0], restored.token_ids),
                          atol=1e-4)
    assert list(sender.folder.iterdir()) == []   # the file is gone once the engine loaded it
    sender.close()
    assert not sender.folder.exists()


def test_this_machine_is_recognised_by_address():
    import socket

    assert is_this_machine("127.0.0.1") and is_this_machine("localhost") and is_this_machine(socket.gethostname())
    assert not is_this_machine("192.0.2.1")   # TEST-NET-1: never a local address


def test_bad_weight_updates_are_refused_by_name(client, tmp_path):
    save_file({"not.a.parameter": torch.zeros(2)}, str(tmp_path / "model.safetensors"))
    with pytest.raises(GenerationServerError, match="unknown parameter names: not.a.parameter"):
        client.load_weights_from_disk(tmp_path)
    with pytest.raises(GenerationServerError, match="no .safetensors files"):
        client.load_weights_from_disk(tmp_path / "empty")


def test_wait_healthy_names_a_server_that_never_answers():
    client = EngineClient(f"http://127.0.0.1:{free_port()}", name="rollout server 3", log_path="/tmp/x.log")
    with pytest.raises(GenerationServerError, match=r"rollout server 3 at .* \(log: /tmp/x.log\) was not healthy"):
        client.wait_healthy(1.0)


def test_stop_strings_end_generation_at_the_string(client, tiny_model):
    from dockyard.models import load_tokenizer

    tokenizer = load_tokenizer(tiny_model)
    greedy = client.generate([PROMPTS[0]], SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))[0]
    index = next(i for i, t in enumerate(greedy.token_ids) if tokenizer.decode([t]).strip())
    stop = tokenizer.decode([greedy.token_ids[index]]).strip()
    out = client.generate([PROMPTS[0]], SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True,
                                                       stop=[stop]))[0]
    assert out.finish_reason == "stop"
    assert out.token_ids == greedy.token_ids[:len(out.token_ids)] and len(out.token_ids) <= index + 1
    assert stop in tokenizer.decode(out.token_ids)


def test_a_qwen2_tiny_model_serves_too(tmp_path):
    import subprocess
    import sys

    from dockyard.generation.engine import Engine
    from tests.conftest import REPO

    subprocess.run([sys.executable, str(REPO / "tools" / "make_tiny_model.py"), "--arch", "qwen2", "--out",
                    str(tmp_path / "tiny-qwen2")], check=True, capture_output=True, timeout=300)
    engine = Engine(tmp_path / "tiny-qwen2")
    assert type(engine.model).__name__ == "Qwen2ForCausalLM"
    (out,) = engine.generate([[2, 5, 6]], SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))
    assert len(out.token_ids) == 4


def test_concurrent_requests_each_get_what_they_get_alone(client):
    """The server merges requests that arrive together into one batch; each answer is still what that
    request gets alone (its seed), and a request with other sampling settings is served too."""
    from concurrent.futures import ThreadPoolExecutor

    requests = [([[3, 4, 5]], SamplingParams(n=2, max_tokens=5, temperature=1.0, ignore_eos=True, seed=s))
                for s in range(6)] + [([[7, 8]], SamplingParams(n=1, max_tokens=4, temperature=0.0, ignore_eos=True))]
    alone = [[c.token_ids for c in client.generate(p, params)] for p, params in requests]
    with ThreadPoolExecutor(len(requests)) as pool:
        together = list(pool.map(lambda r: [c.token_ids for c in client.generate(*r)], requests))
    assert together == alone
    assert len({tuple(map(tuple, a)) for a in alone[:6]}) > 1   # the seeds differ, so do the samples
