"""Model-level TOP on the GPU: Qwen3-0.6B-shaped random bf16 model over the `sglang` backend.

The native engine's log-probs must equal a packed prefill recompute bitwise for mixed batches (short and
long sequences, several packing orders), and stay equal across 3 steps of training with weight handover.
"""

from __future__ import annotations

import random

import pytest
import torch

from top_rl.model import Qwen3, hf_state_dict, sequence_logprobs
from top_rl.engine.interface import SamplingParams
from top_rl.rollout.native.engine import NativeEngine
from tests.gpu._common import QWEN3_06B, decode_equals_extend_claimed, device_model, needs_cuda

pytestmark = [needs_cuda, pytest.mark.gpu]

PROMPT_LENS = [3, 17, 64, 129, 700, 2100]
V = QWEN3_06B["vocab_size"]


def _prompts(seed: int, lens=PROMPT_LENS) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, V) for _ in range(n)] for n in lens]


@pytest.fixture(scope="module")
def model() -> Qwen3:
    return device_model(seed=0)


def _recompute(model, seqs, starts, order, temperature=None, fillers=()):
    """Log-probs of seqs[i] recomputed in one packed prefill laid out in `order`, with filler sequences
    interleaved; returned in the original index order."""
    packed = [seqs[i] for i in order]
    pstarts = [starts[i] for i in order]
    for j, f in enumerate(fillers):
        at = (j * 3) % (len(packed) + 1)
        packed.insert(at, f)
        pstarts.insert(at, 1)
        order = list(order[:at]) + [-1] + list(order[at:])
    with torch.no_grad():
        lps = sequence_logprobs(model, packed, pstarts, temperature)
    out = {i: lp for i, lp in zip(order, lps) if i >= 0}
    return [out[i] for i in range(len(seqs))]


def _orders(n, seed):
    rng = random.Random(seed)
    shuffled = list(range(n))
    rng.shuffle(shuffled)
    return {"same": list(range(n)), "reversed": list(range(n))[::-1], "shuffled": shuffled}


def test_engine_logprobs_equal_packed_recompute(model):
    engine = NativeEngine(model, logprob_source="prefill")
    prompts = _prompts(1)
    samples = engine.generate(prompts, seeds=list(range(len(prompts))), params=SamplingParams(max_new_tokens=12))
    seqs = [s.prompt_ids + s.response_ids for s in samples]
    starts = [len(s.prompt_ids) for s in samples]
    want = [torch.tensor(s.logprobs, dtype=torch.float32) for s in samples]
    assert all(torch.isfinite(w).all() and len(w) == 12 for w in want)
    fillers = _prompts(7, [5, 333, 1500])
    for name, order in _orders(len(seqs), 2).items():
        for fill in ((), fillers):
            got = _recompute(model, seqs, starts, order, fillers=fill)
            for i, (g, w) in enumerate(zip(got, want)):
                assert torch.equal(g.cpu(), w), f"order {name}, fillers {len(fill)}: sample {i} differs"
    for i in range(len(seqs)):  # each sequence alone
        (alone,) = _recompute(model, [seqs[i]], [starts[i]], [0])
        assert torch.equal(alone.cpu(), want[i]), f"sample {i} alone differs"


def test_sampler_path_recompute_is_packing_invariant(model):
    """T != 1 sampler-path log-probs (the loss's numbers) are packing-invariant. The engine's own decode-time
    sampler log-probs equal the prefill recompute where a contract claims the attention backend's decode equals
    its extend; otherwise the contract must refuse logprob_source=decode (§11.3). Measured: bench/probes.py."""
    from top_rl.kernels.sglang import attention as sglang_attention

    claimed = decode_equals_extend_claimed(sglang_attention.attention_backend())
    engine = NativeEngine(model, logprob_source="decode")
    prompts = _prompts(3, [9, 250, 1200])
    samples = engine.generate(prompts, seeds=[5, 6, 7], params=SamplingParams(max_new_tokens=10, temperature=0.7))
    seqs = [s.prompt_ids + s.response_ids for s in samples]
    starts = [len(s.prompt_ids) for s in samples]
    ref = _recompute(model, seqs, starts, [0, 1, 2], temperature=0.7)
    for name, order in _orders(3, 4).items():
        got = _recompute(model, seqs, starts, order, temperature=0.7, fillers=_prompts(8, [40]))
        assert all(torch.equal(a, b) for a, b in zip(got, ref)), f"order {name}"
    if claimed:
        for i, (r, s) in enumerate(zip(ref, samples)):
            assert torch.equal(r.cpu(), torch.tensor(s.sample_logprobs, dtype=r.dtype)), f"sample {i}: decode != prefill"


def _ppo_loss(new_lp, old_lp, adv, clip=0.2):
    ratio = torch.exp(new_lp.float() - old_lp)
    return -torch.min(ratio * adv, ratio.clamp(1 - clip, 1 + clip) * adv).mean()


def test_three_training_steps_keep_parity():
    trainer_model = device_model(seed=11)
    engine_model = device_model(seed=99)  # different start: the first handover must overwrite it
    engine = NativeEngine(engine_model, logprob_source="prefill")
    engine.load_named_tensors(hf_state_dict(trainer_model))
    opt = torch.optim.AdamW(trainer_model.parameters(), lr=1e-4, weight_decay=0.0)
    temperature = 0.8
    for step in range(3):
        prompts = _prompts(100 + step, [5, 40, 300, 900])
        samples = engine.generate(prompts, seeds=[step * 10 + i for i in range(4)],
                                  params=SamplingParams(max_new_tokens=8, temperature=temperature))
        seqs = [s.prompt_ids + s.response_ids for s in samples]
        starts = [len(s.prompt_ids) for s in samples]
        trainer_model.train()
        # the gate: trainer recompute (grad-enabled forward, other packing) == engine log-probs, bitwise
        gate = sequence_logprobs(trainer_model, seqs[::-1], starts[::-1])[::-1]
        for i, (g, s) in enumerate(zip(gate, samples)):
            assert torch.equal(g.detach().cpu(), torch.tensor(s.logprobs, dtype=torch.float32)), f"step {step} sample {i}"
        new = torch.cat(sequence_logprobs(trainer_model, seqs, starts, temperature))
        old = torch.cat([torch.tensor(s.sample_logprobs, dtype=torch.float32) for s in samples]).cuda()
        adv = torch.cat([torch.full((len(s.response_ids),), 1.0 if i % 2 else -1.0) for i, s in enumerate(samples)]).cuda()
        loss = _ppo_loss(new, old, adv)
        opt.zero_grad()
        loss.backward()
        for name, p in trainer_model.named_parameters():
            assert p.grad is not None and torch.isfinite(p.grad).all(), f"step {step}: bad grad for {name}"
        before = trainer_model.layers[0].qkv_proj.detach().clone()
        opt.step()
        assert not torch.equal(before, trainer_model.layers[0].qkv_proj), f"step {step}: weights did not change"
        assert torch.isfinite(loss)
        assert all(torch.isfinite(p).all() for p in trainer_model.parameters())
        engine.load_named_tensors(hf_state_dict(trainer_model))  # weight handover
