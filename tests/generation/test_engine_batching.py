"""Batched decoding gives each sample what it would get alone: prompts prefilled once for their n
samples, finished rows leaving the batch."""

import pytest
import torch

from dockyard.generation.engine import Engine, SamplingParams

PROMPTS = [[5, 9, 14, 3, 8], [7, 7, 2], [12, 6, 40, 41, 42, 43, 44, 45]]


def test_shared_prefill_and_compaction_match_decoding_alone(tiny_model):
    engine = Engine(tiny_model, max_batch_size=64)
    greedy = SamplingParams(n=1, max_tokens=10, temperature=0.0, ignore_eos=True)
    alone = [engine.generate([p], greedy)[0].token_ids for p in PROMPTS]
    # stop the first prompt's answers early, so its rows finish while the others decode on
    # the first token of prompt 0's answer, from the third on, that appears nowhere earlier
    at = next(i for i in range(2, 9) if alone[0][i] not in alone[0][:i] + alone[1] + alone[2][:9])
    stop = alone[0][at]
    params = SamplingParams(n=3, max_tokens=10, temperature=0.0, ignore_eos=True, stop_token_ids=[stop])
    reference = [engine.generate([p], SamplingParams(n=1, max_tokens=10, temperature=0.0, ignore_eos=True,
                                                     stop_token_ids=[stop]))[0] for p in PROMPTS]
    batched = engine.generate(PROMPTS, params)

    assert [c.prompt_index for c in batched] == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert len(batched[0].token_ids) == at + 1 and batched[0].finish_reason == "stop"
    for completion in batched:
        alone_completion = reference[completion.prompt_index]
        assert completion.token_ids == alone_completion.token_ids
        assert completion.finish_reason == alone_completion.finish_reason
        torch.testing.assert_close(torch.tensor(completion.logprobs), torch.tensor(alone_completion.logprobs),
                                   atol=1e-4, rtol=1e-4)


def test_merged_requests_each_keep_their_own_random_stream_and_length(tiny_model):
    """Requests decoded in one batch (what the server does with concurrent ones) sample exactly what
    each would alone: their own seed, n and max_tokens."""
    engine = Engine(tiny_model, max_batch_size=64)
    requests = [([PROMPTS[0]], SamplingParams(n=2, max_tokens=6, temperature=1.0, ignore_eos=True, seed=11)),
                ([PROMPTS[1], PROMPTS[2]], SamplingParams(n=3, max_tokens=9, temperature=1.0, ignore_eos=True, seed=5))]
    alone = [engine.generate(prompts, params) for prompts, params in requests]
    merged = engine.generate_many(requests)
    for got, want in zip(merged, alone):
        assert [(c.prompt_index, c.token_ids, c.finish_reason) for c in got] == \
            [(c.prompt_index, c.token_ids, c.finish_reason) for c in want]
    assert {len(c.token_ids) for c in merged[0]} == {6} and {len(c.token_ids) for c in merged[1]} == {9}


def test_requests_with_different_sampling_settings_are_not_merged(tiny_model):
    engine = Engine(tiny_model)
    with pytest.raises(ValueError, match="share their sampling settings"):
        engine.generate_many([([PROMPTS[0]], SamplingParams(temperature=1.0)),
                              ([PROMPTS[1]], SamplingParams(temperature=0.5))])


def test_batched_prefill_scoring_equals_each_sequence_alone(tiny_model):
    """Scoring pads rows of different lengths into forwards of SCORE_ROWS rows; every logprob is the
    one the sequence gets in a forward of its own (20 sequences: two forwards, the second partial)."""
    from dockyard.models import load_causal_lm

    engine = Engine(tiny_model)
    sequences = [[1] + [(7 * i + 3 * j) % 50 + 2 for j in range(2 + i % 9)] for i in range(20)]
    got = engine.score(sequences)
    model = load_causal_lm(tiny_model).eval()
    for sequence, scores in zip(sequences, got):
        with torch.no_grad():
            logits = model(torch.tensor([sequence])).logits[0, :-1]
        want = torch.log_softmax(logits, -1).gather(-1, torch.tensor(sequence[1:])[:, None])[:, 0]
        torch.testing.assert_close(torch.tensor(scores), want, atol=1e-5, rtol=0)
