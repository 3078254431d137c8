"""Model-level TOP property: a response's log-probs are the same bits whether computed by decode with a
KV cache inside a batch, by a prefill of that sequence alone, or inside a packed batch in any order."""

import random

import pytest
import torch

from top_rl.model import sequence_logprobs
from top_rl.engine.interface import SamplingParams
from top_rl.rollout.native.engine import NativeEngine
from tests.helpers import random_sequences, tiny_model, use_backend

CASES = [(gqa, tied, dtype) for gqa in (1, 2, 4) for tied in (True, False) for dtype in ("float32", "bfloat16")]


def _rollout(model, temperature, n=6, max_new=12, seed=0):
    prompts = random_sequences(n, 2, 9, model.cfg.vocab_size, seed)
    engine = NativeEngine(model, logprob_source="decode")
    return engine.generate(prompts, [seed * 100 + i for i in range(n)], SamplingParams(max_new, temperature))


@pytest.mark.parametrize("gqa,tied,dtype", CASES)
def test_decode_prefill_packed_agree(gqa, tied, dtype):
    with use_backend("reference"):
        model = tiny_model(dtype, seed=gqa, gqa=gqa, tied=tied)
        for temperature in (1.0, 0.7):
            samples = _rollout(model, temperature)
            seqs = [s.prompt_ids + s.response_ids for s in samples]
            starts = [len(s.prompt_ids) for s in samples]
            target = 2
            decode = torch.tensor(samples[target].sample_logprobs, dtype=model.policy.compute)
            alone = sequence_logprobs(model, [seqs[target]], [starts[target]], temperature)[0]
            assert torch.equal(alone, decode), "decode (in a batch, KV cache) != prefill alone"
            order = list(range(len(seqs)))
            for shuffle_seed in (0, 1):
                random.Random(shuffle_seed).shuffle(order)
                packed = sequence_logprobs(model, [seqs[i] for i in order], [starts[i] for i in order], temperature)
                assert torch.equal(packed[order.index(target)], alone), "packed prefill != prefill alone"
            # the engine's default source: prefill re-scoring (fp32, untempered) equals a packed recompute
            prefill = NativeEngine(model, "prefill").score([s.prompt_ids for s in samples],
                                                           [s.response_ids for s in samples])
            recompute = sequence_logprobs(model, seqs, starts)
            assert all(torch.equal(torch.tensor(p), r) for p, r in zip(prefill, recompute))


def test_engine_sample_does_not_depend_on_its_batch():
    with use_backend("reference"):
        model = tiny_model("bfloat16", seed=3)
        engine = NativeEngine(model, "decode")
        prompts = random_sequences(7, 2, 9, model.cfg.vocab_size, 5)
        params = SamplingParams(max_new_tokens=16, temperature=0.9)
        batch = engine.generate(prompts, list(range(7)), params)
        for i in (0, 4):
            alone = engine.generate([prompts[i]], [i], params)[0]
            assert alone.response_ids == batch[i].response_ids
            assert alone.sample_logprobs == batch[i].sample_logprobs


def test_plain_backend_decode_and_prefill_differ():
    """Without TOP kernels the same model gives decode and prefill different bits on this CPU, so the
    property the reference backend provides is real. (fp32: most samples differ; CPU bf16 GEMMs differ
    only occasionally at these sizes, so fp32 is the case shown.)"""
    with use_backend("plain"):
        model = tiny_model("float32", seed=0)
        diffs = 0
        for n in (1, 3, 8):
            samples = _rollout(model, 1.0, n=n, seed=n)
            seqs = [s.prompt_ids + s.response_ids for s in samples]
            packed = sequence_logprobs(model, seqs, [len(s.prompt_ids) for s in samples], 1.0)
            diffs += sum(not torch.equal(p, torch.tensor(s.sample_logprobs, dtype=p.dtype))
                         for p, s in zip(packed, samples))
        assert diffs > 0


def test_scoring_in_token_budget_chunks_and_logits_of_chosen_rows_change_no_bit():
    """sequence_logprobs packs sequences into calls of at most max_tokens tokens (token_budget_chunks) and computes
    the logits of the scored rows only: the same bits as one call over everything, and as all logits indexed."""
    from top_rl.model import pack
    from top_rl.model.packing import token_budget_chunks

    assert token_budget_chunks([3, 4, 2, 9, 1], 7) == [range(0, 2), range(2, 3), range(3, 4), range(4, 5)]
    assert token_budget_chunks([3, 4], 100) == [range(0, 2)] and token_budget_chunks([], 5) == []
    with use_backend("reference"):
        model = tiny_model("bfloat16", seed=4)
        seqs = random_sequences(9, 3, 20, model.cfg.vocab_size, 8)
        starts = [2] * len(seqs)
        for temperature in (None, 0.8):
            whole = sequence_logprobs(model, seqs, starts, temperature, max_tokens=10_000)
            chunked = sequence_logprobs(model, seqs, starts, temperature, max_tokens=25)
            assert all(torch.equal(a, b) for a, b in zip(whole, chunked))
        ids, pos, cu = pack(seqs)
        rows = torch.tensor([0, 5, 17, int(cu[-1]) - 1])
        with torch.no_grad():
            assert torch.equal(model(ids, pos, cu, logit_rows=rows), model(ids, pos, cu)[rows])
