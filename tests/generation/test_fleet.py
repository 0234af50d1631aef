"""Several replicas behind one Generator (two real embedded-engine servers): groups spread and kept
whole, least outstanding work first, one broadcast group refitting both, errors naming the replica;
and the SGLang client speaking SGLang's native /generate to the embedded engine."""

import pytest
import torch

from dockyard.distributed import free_port
from dockyard.generation.client import EngineClient
from dockyard.generation.engine import SamplingParams
from dockyard.generation.fleet import GeneratorFleet
from dockyard.generation.generator import GenerationServerError
from dockyard.generation.sglang import SglangClient
from dockyard.generation.weight_transfer import FleetRefit, WeightBroadcaster
from dockyard.models import load_causal_lm
from tests.conftest import running_engine_server

PROMPTS = [[5, 9, 14, 3, 8], [7, 7, 2], [12, 6, 40], [3, 4, 5, 6], [20, 21]]


@pytest.fixture(scope="module")
def second_server(tiny_model, tmp_path_factory):
    with running_engine_server(tiny_model, tmp_path_factory.mktemp("engine2")) as (url, _):
        yield url


@pytest.fixture
def fleet(engine_server, second_server):
    made = GeneratorFleet([EngineClient(engine_server[0], name="replica 0"), EngineClient(second_server, name="replica 1")])
    yield made
    made.close()


def test_groups_are_spread_over_replicas_and_never_split(fleet):
    params = SamplingParams(n=3, max_tokens=4, temperature=1.0, seed=5, ignore_eos=True)
    out = fleet.generate(PROMPTS, params)
    assert fleet.last_assignment == [0, 1, 0, 1, 0]
    assert [c.prompt_index for c in out] == [i for i in range(len(PROMPTS)) for _ in range(3)]
    assert fleet.outstanding == [0, 0] and fleet.groups_served == [3, 2]
    # each group's samples are what its replica gives for that group alone (same seed, same chunk)
    alone = fleet.replicas[1].generate([PROMPTS[1], PROMPTS[3]], SamplingParams(
        n=3, max_tokens=4, temperature=1.0, seed=5 + 7919 * 1, ignore_eos=True))
    assert [c.token_ids for c in out if c.prompt_index in (1, 3)] == [c.token_ids for c in alone]


def test_each_replicas_request_seconds_are_the_steps_generation_timeline(fleet):
    params = SamplingParams(n=2, max_tokens=4, temperature=1.0, seed=5, ignore_eos=True)
    fleet.take_request_seconds()   # earlier tests' calls
    fleet.generate(PROMPTS, params)
    fleet.generate(PROMPTS[:1], params)
    timeline = fleet.take_request_seconds()
    assert set(timeline) == {"gen/request_seconds/replica0", "gen/request_seconds/replica1"}
    assert len(timeline["gen/request_seconds/replica0"]) == 2 and len(timeline["gen/request_seconds/replica1"]) == 1
    assert all(0 < s < 60 for seconds in timeline.values() for s in seconds)
    assert fleet.take_request_seconds() == {"gen/request_seconds/replica0": [], "gen/request_seconds/replica1": []}


def test_groups_go_to_the_replica_with_the_least_outstanding_work(fleet):
    fleet.outstanding[0] = 10_000          # replica 0 busy with another call's work
    try:
        fleet.generate(PROMPTS[:3], SamplingParams(n=2, max_tokens=3, temperature=1.0, seed=1))
        assert fleet.last_assignment == [1, 1, 1]
    finally:
        fleet.outstanding[0] -= 10_000
    assert fleet.outstanding == [0, 0]


def test_one_broadcast_group_refits_every_replica(fleet, tiny_model):
    model = load_causal_lm(tiny_model)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    state["lm_head.weight"].zero_()     # a uniform next-token distribution, visible in the logprobs
    WeightBroadcaster(fleet.replicas, "127.0.0.1", free_port()).push(state.items())
    out = fleet.generate(PROMPTS[:2], SamplingParams(n=1, max_tokens=3, temperature=1.0, seed=0))
    assert fleet.last_assignment == [0, 1]
    for completion in out:
        assert all(abs(lp + torch.log(torch.tensor(512.0)).item()) < 1e-4 for lp in completion.logprobs)
    refit = FleetRefit(fleet.replicas, ["127.0.0.1", "127.0.0.1"], "auto", "127.0.0.1", log=lambda _: None)
    assert refit.paths == {"replica 0": "shared_memory", "replica 1": "shared_memory"}
    refit.push(dict(model.state_dict()))   # back to the model's weights, through /dev/shm
    refit.close()
    greedy = fleet.generate(PROMPTS[:2], SamplingParams(n=1, max_tokens=3, temperature=0.0))
    assert all(min(c.logprobs) > -6.0 for c in greedy)   # no longer uniform (log 1/512 = -6.24)


def test_a_failing_replica_is_named(engine_server):
    dead = EngineClient(f"http://127.0.0.1:{free_port()}", name="rollout replica 1 (embedded)")
    fleet = GeneratorFleet([EngineClient(engine_server[0], name="rollout replica 0 (embedded)"), dead])
    with pytest.raises(GenerationServerError, match=r"rollout replica 1 \(embedded\) at .* is unreachable"):
        fleet.generate(PROMPTS[:2], SamplingParams(n=1, max_tokens=2))
    assert fleet.outstanding == [0, 0]
    assert [r.name for r in fleet.unhealthy()] == ["rollout replica 1 (embedded)"]


def test_sglang_client_speaks_the_native_generate_api(engine_server, tiny_model):
    url, _ = engine_server
    sglang, plain = SglangClient(url, name="sglang"), EngineClient(url)
    model = load_causal_lm(tiny_model).eval()
    out = sglang.generate(PROMPTS[:2], SamplingParams(n=2, max_tokens=4, temperature=1.0, seed=3, ignore_eos=True))
    assert [c.prompt_index for c in out] == [0, 0, 1, 1]
    for c in out:
        ids = torch.tensor([PROMPTS[c.prompt_index] + c.token_ids])
        with torch.no_grad():
            logits = model(ids).logits[0, len(PROMPTS[c.prompt_index]) - 1:-1]
        expected = torch.log_softmax(logits, -1).gather(-1, torch.tensor(c.token_ids)[:, None])[:, 0]
        torch.testing.assert_close(torch.tensor(c.logprobs), expected, atol=1e-4, rtol=0)
        assert len(c.token_ids) == 4 and c.finish_reason == "length"
    sequences = [PROMPTS[0] + [30, 31], PROMPTS[1] + [32]]
    starts = [len(PROMPTS[0]), len(PROMPTS[1])]
    torch.testing.assert_close(torch.tensor(sglang.score(sequences, starts)[0]),
                               torch.tensor(plain.score(sequences, starts)[0]), atol=1e-5, rtol=0)
    sglang.pause()
    sglang.resume()


def test_backends_that_cannot_forward_images_say_so_after_the_same_gate(engine_server):
    """SGLang applies the gate but does not forward images yet; the embedded engine is
    text-only. Neither drops an image silently; both still serve text."""
    from PIL import Image

    from dockyard.generation.images import ImageGate, ImageRejected

    url, _ = engine_server
    image = Image.new("RGB", (4, 4))
    gate = ImageGate(allowed=True, max_pixels=100, max_per_sample=1)
    for client, named in ((SglangClient(url, name="sglang", image_gate=gate), "sglang backend does not forward"),
                          (EngineClient(url, name="embedded", image_gate=gate), "text-only models")):
        with pytest.raises(GenerationServerError, match=named):
            client.generate([PROMPTS[0]], SamplingParams(max_tokens=2), [[image]])
        with pytest.raises(ImageRejected, match="max_images_per_sample"):   # the gate runs first
            client.generate([PROMPTS[0]], SamplingParams(max_tokens=2), [[image, image]])
        assert len(client.generate([PROMPTS[0]], SamplingParams(max_tokens=2), [[]])) == 1
