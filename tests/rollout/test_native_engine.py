"""The native engine's decode loop on CPU: rows decode on past their stop token and are cut at the end, the host's
"all stopped?" read only ends the loop early, and neither changes a sample (its tokens depend only on its prompt,
seed and the weights)."""

from __future__ import annotations

import pytest

from top_rl.rollout.native import engine as native
from top_rl.engine.interface import SamplingParams
from top_rl.rollout.native.engine import NativeEngine
from tests.helpers import random_sequences, tiny_model, use_backend


@pytest.fixture(autouse=True)
def _reference():
    with use_backend("reference"):
        yield


def test_a_sample_with_stop_tokens_is_the_free_run_cut_at_its_first_stop():
    model = tiny_model("bfloat16", seed=2)
    prompts = random_sequences(12, 2, 7, model.cfg.vocab_size, 4)
    seeds = list(range(100, 112))
    free = NativeEngine(model, "decode", eos_token_id=-1).generate(prompts, seeds, SamplingParams(20, 1.0))
    assert all(s.finish_reason == "length" and len(s.response_ids) == 20 for s in free)
    stops = (free[0].response_ids[3], free[5].response_ids[0])  # one row stops at its 4th token, another at once
    cut = NativeEngine(model, "decode", eos_token_id=-1).generate(prompts, seeds, SamplingParams(20, 1.0, stops))
    for f, c in zip(free, cut):
        first = next((k for k, t in enumerate(f.response_ids) if t in stops), None)
        want = f.response_ids if first is None else f.response_ids[:first + 1]
        assert c.response_ids == want and c.sample_logprobs == f.sample_logprobs[:len(want)]
        assert c.finish_reason == ("length" if first is None else "stop")
    assert len(cut[5].response_ids) == 1 and any(c.finish_reason == "length" for c in cut)


def test_the_all_stopped_check_only_ends_the_loop(monkeypatch):
    """Every row meets a stop token within its first 7 tokens: checking every step or never gives the same samples
    (and prefill scores), and checking ends the loop well before max_new_tokens."""
    model = tiny_model("float32", seed=0)
    prompts = random_sequences(6, 2, 5, model.cfg.vocab_size, 1)
    free = NativeEngine(model, "decode", eos_token_id=-1).generate(prompts, list(range(6)), SamplingParams(8, 1.0))
    stops = tuple({s.response_ids[1 + i] for i, s in enumerate(free)})  # row i stops by its token i + 1
    steps = []
    real = native.DecodeState.step
    monkeypatch.setattr(native.DecodeState, "step", lambda self: steps.append(1) or real(self))
    results = {}
    for every in (1, 10_000):
        monkeypatch.setattr(native, "CHECK_EVERY", every)
        steps.clear()
        engine = NativeEngine(model, "prefill", eos_token_id=-1)
        results[every] = engine.generate(prompts, list(range(6)), SamplingParams(40, 1.0, stops)), len(steps)
    (checked, n_checked), (unchecked, n_unchecked) = results[1], results[10_000]
    assert [(s.response_ids, s.logprobs, s.finish_reason) for s in checked] == \
        [(s.response_ids, s.logprobs, s.finish_reason) for s in unchecked]
    assert all(s.finish_reason == "stop" and len(s.response_ids) <= 7 for s in checked)
    assert n_unchecked == 39 and n_checked == max(len(s.response_ids) for s in checked) - 1


def test_bad_calls_are_refused():
    engine = NativeEngine(tiny_model())
    with pytest.raises(ValueError, match="2 prompts but 1 seeds"):
        engine.generate([[3], [4]], [0], SamplingParams(2))
    with pytest.raises(ValueError, match="0 prompts but 1 seeds"):
        engine.generate([], [0], SamplingParams(2))
    assert engine.generate([], [], SamplingParams(2)) == []
    with pytest.raises(ValueError, match="exceeds max_position_embeddings=256"):
        engine.generate([[3] * 250], [0], SamplingParams(7))
