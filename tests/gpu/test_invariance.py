"""Batch invariance of every `sglang`-backend kernel on the GPU, with torch.equal (never a tolerance).

A target row is placed at a random offset among 0..63 random neighbours (batch sizes 1..64, plus a few
multi-tile sizes); its output bits must equal those of the target computed alone.
"""

from __future__ import annotations

import random

import pytest
import torch

from top_rl import kernels
from tests.gpu._common import QWEN3_06B, decode_equals_extend_claimed, needs_cuda

pytestmark = [needs_cuda, pytest.mark.gpu]

BATCHES = list(range(1, 65)) + [127, 129, 1000, 4096]
H, F, V = QWEN3_06B["hidden_size"], QWEN3_06B["intermediate_size"], QWEN3_06B["vocab_size"]
HQ, HKV, D = QWEN3_06B["num_attention_heads"], QWEN3_06B["num_key_value_heads"], QWEN3_06B["head_dim"]
# (K, N) of every GEMM of the model: qkv, o_proj, gate_up, down, lm_head
GEMMS = [(H, HQ * D + 2 * HKV * D), (HQ * D, H), (H, 2 * F), (F, H), (H, V)]


def _batch(target: torch.Tensor, b: int, seed: int, scale: float = 3.0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    rows = (torch.randn((b,) + target.shape[1:], generator=g, device="cuda") * scale).to(target.dtype)
    at = random.Random(seed).randrange(b)
    rows[at] = target[0]
    return rows, at


def _check(fn, target, batches=BATCHES, extra=None):
    """fn(rows, at) -> tuple of row-major outputs; each output's row `at` must equal the lone target's."""
    alone = fn(target, 0)
    for b in batches:
        rows, at = _batch(target, b, seed=1000 + b)
        outs = fn(rows, at)
        for a, o in zip(alone, outs):
            assert torch.equal(o[at], a[0]), f"row changed at batch size {b}"


@pytest.mark.parametrize("k,n", GEMMS, ids=lambda x: str(x))
def test_linear(k, n):
    w = (torch.randn(n, k, device="cuda") * 0.02).bfloat16()
    x = torch.randn(1, k, device="cuda").bfloat16()
    _check(lambda r, at: (kernels.linear(r, w),), x)


@pytest.mark.parametrize("residual", [False, True])
def test_rms_norm_hidden(residual):
    w = 1 + 0.1 * torch.randn(H, device="cuda")
    x = torch.randn(1, H, device="cuda")
    if residual:
        res = torch.randn(1, H, device="cuda")
        h = x.bfloat16()

        def fn(rows, at):
            r = torch.roll(rows, 1, 0).float() if rows.shape[0] > 1 else rows.float() * 0.5
            r[at] = res[0]
            return kernels.rms_norm(rows, w, 1e-6, r, out_dtype=torch.float32)

        _check(fn, h)
    else:
        _check(lambda r, at: (kernels.rms_norm(r, w, 1e-6, out_dtype=torch.float32),), x)


def test_rms_norm_per_head():
    w = 1 + 0.1 * torch.randn(D, device="cuda")
    q = torch.randn(1, HQ, D, device="cuda").bfloat16()
    _check(lambda r, at: (kernels.rms_norm(r, w, 1e-6),), q)


def test_rope():
    cos_sin = kernels.rope_cache(D, 1_000_000.0, 8192).cuda()
    x = torch.randn(1, HQ, D, device="cuda")

    def fn(rows, at):
        pos = torch.randint(0, 8192, (rows.shape[0],), device="cuda", generator=torch.Generator("cuda").manual_seed(rows.shape[0]))
        pos[at] = 4321
        return (kernels.rope(rows, pos, cos_sin),)

    _check(fn, x)


def test_silu_and_mul():
    g = torch.randn(1, 2 * F, device="cuda").bfloat16()
    _check(lambda r, at: (kernels.silu_and_mul(r),), g)


@pytest.mark.parametrize("temperature", [None, 1.0, 0.7])
def test_logprobs(temperature):
    logits = (torch.randn(1, V, device="cuda") * 4).bfloat16()

    def fn(rows, at):
        ids = torch.randint(0, V, (rows.shape[0],), device="cuda")
        ids[at] = 12345
        if temperature is None:
            return (kernels.prefill_logprobs(rows, ids),)
        return kernels.sample_logprobs(rows, ids, temperature), kernels.sampler_log_softmax(rows, temperature)

    _check(fn, logits, batches=list(range(1, 65)) + [1000])


def _qkv(lengths, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    t = sum(lengths)
    q, k, v = (torch.randn(t, h, D, generator=g, device="cuda").bfloat16() for h in (HQ, HKV, HKV))
    cu = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0)), device="cuda")
    return q, k, v, cu


@pytest.mark.parametrize("target_len", [1, 77, 300, 1100])
def test_attention_packing(target_len):
    """The target sequence's outputs do not depend on what is packed around it, nor where."""
    tq, tk, tv, tcu = _qkv([target_len], seed=target_len)
    alone = kernels.attention(tq, tk, tv, tcu, D**-0.5)
    rng = random.Random(target_len)
    for trial in range(12):
        others = [rng.randint(1, 900) for _ in range(rng.randint(1, 6))]
        oq, ok, ov, ocu = _qkv(others, seed=trial)
        at = rng.randint(0, len(others))
        lens = others[:at] + [target_len] + others[at:]
        start = sum(others[:at])
        cat = lambda o, t: torch.cat([o[:start], t, o[start:]])  # noqa: E731
        cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), device="cuda")
        out = kernels.attention(cat(oq, tq), cat(ok, tk), cat(ov, tv), cu, D**-0.5)
        assert torch.equal(out[start : start + target_len], alone), f"trial {trial}: packing {lens}"


def test_decode_attention_batching():
    """A decode row does not depend on its batch neighbours nor the cache capacity."""
    g = torch.Generator(device="cuda").manual_seed(0)
    n = 613  # cache length of the target: 3 triton KV splits of 256
    q = torch.randn(1, HQ, D, generator=g, device="cuda").bfloat16()
    kc = torch.randn(1, n, HKV, D, generator=g, device="cuda").bfloat16()
    vc = torch.randn(1, n, HKV, D, generator=g, device="cuda").bfloat16()
    alone = kernels.decode_attention(q, kc, vc, torch.tensor([n], device="cuda"), D**-0.5)
    rng = random.Random(0)
    for b in list(range(1, 17)) + [64]:
        cap = n + rng.randint(0, 3000)
        at = rng.randrange(b)
        qs = torch.randn(b, HQ, D, generator=g, device="cuda").bfloat16()
        ks = torch.randn(b, cap, HKV, D, generator=g, device="cuda").bfloat16()
        vs = torch.randn(b, cap, HKV, D, generator=g, device="cuda").bfloat16()
        lengths = torch.tensor([rng.randint(1, cap) for _ in range(b)], device="cuda")
        qs[at], ks[at, :n], vs[at, :n], lengths[at] = q[0], kc[0], vc[0], n
        out = kernels.decode_attention(qs, ks, vs, lengths, D**-0.5)
        assert torch.equal(out[at], alone[0]), f"batch {b}, capacity {cap}"


def test_decode_vs_prefill_bits_are_equal_or_refused():
    """Decode vs prefill attention for the same query: close always. Bitwise equality decides `decode` log-prob
    parity, so it is asserted where a contract claims it (decode_equals_extend) and otherwise the contract must
    refuse logprob_source=decode with this backend (§11.3: triton's split-KV decode differs from its extend).
    The measured bits: bench/probes.py."""
    from top_rl.kernels.sglang import attention as sglang_attention

    claimed = decode_equals_extend_claimed(sglang_attention.attention_backend())
    for n in (1, 100, 613):
        q, k, v, cu = _qkv([n], seed=n)
        pre = kernels.attention(q, k, v, cu, D**-0.5)[-1]
        dec = kernels.decode_attention(q[-1:], k[None], v[None], torch.tensor([n], device="cuda"), D**-0.5)[0]
        assert (pre.float() - dec.float()).abs().max() < 2e-2
        if claimed:
            assert torch.equal(pre, dec), f"length {n}: decode != prefill bits, yet a contract claims them equal"


def test_compiled_rope_is_close_to_eager():
    """The engine's RoPE is Inductor-compiled apply_rotary_emb; an eager evaluation of the same formula
    (e.g. Megatron's unfused RoPE) can differ in the last fp32 bit (§4.5, §11.4), which is why the trainer applies
    kernels.rope (its bits: tests/gpu/test_trainer_megatron.py). Here: close always. How many bits differ is a
    measurement, not a claim: bench/probes.py."""
    from top_rl.kernels import reference

    cos_sin = kernels.rope_cache(D, 1_000_000.0, 8192).cuda()
    x = torch.randn(4096, HQ, D, device="cuda")
    pos = torch.randint(0, 8192, (4096,), device="cuda")
    compiled, eager = kernels.rope(x, pos, cos_sin), reference.rope(x, pos, cos_sin)
    assert (compiled - eager).abs().max() < 1e-5
