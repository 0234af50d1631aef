"""Batched decoding gives each sample what it would get alone: prompts prefilled once for their n
samples, finished rows leaving the batch."""

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
