"""The flashinfer attention path (fa2, as SGLang 0.5.10.post1 runs it in deterministic mode) on the GPU, whatever
TOP_RL_ATTENTION_BACKEND says: K/V laid out as the model and the trainer produce them (V a column slice of the
fused qkv projection), packing invariance, and decode batching. Skipped where flashinfer is not importable (carry
the `flashinfer` group of scripts/gpu_bundle.sh). The whole suite under TOP_RL_ATTENTION_BACKEND=flashinfer runs
the model and trainer parity tests on this path too.
"""

from __future__ import annotations

import random

import pytest
import torch

from top_rl import kernels
from tests.gpu._common import QWEN3_06B, needs_cuda

pytestmark = [needs_cuda, pytest.mark.gpu]

HQ, HKV, D = QWEN3_06B["num_attention_heads"], QWEN3_06B["num_key_value_heads"], QWEN3_06B["head_dim"]


@pytest.fixture(autouse=True)
def flashinfer_backend():
    pytest.importorskip("flashinfer", reason="flashinfer not importable (carry .gpu_bundle/flashinfer)")
    from top_rl.kernels import sglang_attention

    before = sglang_attention.attention_backend()
    sglang_attention.set_attention_backend("flashinfer")
    try:
        yield
    finally:
        sglang_attention.set_attention_backend(before)


def _fused_qkv(t, seed):
    """q, k, v as model/qwen3.py and Megatron produce them: views into one [t, (Hq + 2 Hkv) d] projection,
    q and k then made fresh (norm + RoPE), v left a strided view."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    qkv = torch.randn(t, (HQ + 2 * HKV) * D, generator=g, device="cuda").bfloat16()
    q, k, v = qkv.split([HQ * D, HKV * D, HKV * D], dim=-1)
    return q.reshape(t, HQ, D).contiguous(), k.reshape(t, HKV, D).contiguous(), v.reshape(t, HKV, D)


def test_prefill_with_v_sliced_from_fused_qkv():
    """Was `Check failed: paged_k_cache.stride(i) == paged_v_cache.stride(i) (1024 vs. 4096)` on the H200."""
    lengths = [5, 300, 1100]
    q, k, v = _fused_qkv(sum(lengths), seed=0)
    assert not v.is_contiguous()
    cu = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), device="cuda")
    out = kernels.attention(q, k, v, cu, D**-0.5)
    same = kernels.attention(q, k, v.contiguous(), cu, D**-0.5)
    assert torch.equal(out, same), "the V layout changed flashinfer's bits"
    from top_rl.kernels import sglang_attention

    sglang_attention.set_attention_backend("triton")
    other = kernels.attention(q, k, v, cu, D**-0.5)
    assert (out.float() - other.float()).abs().max() < 2e-2  # an independent kernel: close, not equal


def test_prefill_packing_invariance():
    rng = random.Random(0)
    tq, tk, tv = _fused_qkv(613, seed=1)
    alone = kernels.attention(tq, tk, tv, torch.tensor([0, 613], device="cuda"), D**-0.5)
    for trial in range(6):
        others = [rng.randint(1, 900) for _ in range(rng.randint(1, 5))]
        oq, ok, ov = _fused_qkv(sum(others), seed=10 + trial)
        at = rng.randint(0, len(others))
        start = sum(others[:at])
        cat = lambda o, t: torch.cat([o[:start], t, o[start:]])  # noqa: E731
        lens = others[:at] + [613] + others[at:]
        cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), device="cuda")
        out = kernels.attention(cat(oq, tq), cat(ok, tk), cat(ov, tv), cu, D**-0.5)
        assert torch.equal(out[start:start + 613], alone), f"trial {trial}: packing {lens}"


def test_decode_with_strided_cache_views():
    g = torch.Generator(device="cuda").manual_seed(3)
    b, cap = 4, 700
    q = torch.randn(b, HQ, D, generator=g, device="cuda").bfloat16()
    kv = torch.randn(b, cap, 2 * HKV, D, generator=g, device="cuda").bfloat16()
    kc, vc = kv[:, :, :HKV], kv[:, :, HKV:]  # strided views of one cache tensor
    lengths = torch.tensor([1, 256, 613, 700], device="cuda")
    out = kernels.decode_attention(q, kc, vc, lengths, D**-0.5)
    same = kernels.decode_attention(q, kc.contiguous(), vc.contiguous(), lengths, D**-0.5)
    assert torch.equal(out, same)
    for i in range(b):  # each row alone: batch-invariant
        one = kernels.decode_attention(q[i:i + 1], kc[i:i + 1].contiguous(), vc[i:i + 1].contiguous(), lengths[i:i + 1],
                                       D**-0.5)
        assert torch.equal(one[0], out[i]), f"row {i} changed with its batch"
