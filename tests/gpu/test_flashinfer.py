"""The flashinfer attention path (fa2, as SGLang 0.5.11 runs it in deterministic mode) on the GPU, whatever
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
from tests.gpu._common import QWEN3_06B, needs_cuda, rel_err

pytestmark = [needs_cuda, pytest.mark.gpu]

HQ, HKV, D = QWEN3_06B["num_attention_heads"], QWEN3_06B["num_key_value_heads"], QWEN3_06B["head_dim"]


@pytest.fixture(autouse=True)
def flashinfer_backend():
    pytest.importorskip("flashinfer", reason="flashinfer not importable (carry .gpu_bundle/flashinfer)")
    from top_rl.kernels.sglang import attention as sglang_attention

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
    from top_rl.kernels.sglang import attention as sglang_attention

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


def _cu(lengths):
    return torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), device="cuda")


def test_forward_return_lse_gives_the_engine_forwards_output():
    """The trainer's forward asks flashinfer for its LSE too (forward_return_lse) when a gradient follows; the
    engine calls forward. The output must be the same bits, or the gate would compare different forwards."""
    from top_rl.kernels import packed_batch
    from top_rl.kernels.sglang import attention as sglang_attention

    lengths = [5, 300, 1100, 4500]  # the last one spans two 4096 splits: the merged LSE path
    q, k, v = _fused_qkv(sum(lengths), seed=3)
    cu = _cu(lengths)  # held: a PackedBatch refers to its tensor weakly
    batch = packed_batch.packed_batch(cu)
    state = sglang_attention.FlashinferState.get(q.device)
    plain, none = state.run_prefill(q, k, v, batch, D**-0.5, want_lse=False)
    with_lse, lse = state.run_prefill(q, k, v, batch, D**-0.5, want_lse=True)
    assert none is None and torch.equal(plain, with_lse)
    assert lse.shape == (q.shape[0], HQ) and lse.dtype == torch.float32


def test_flashinfer_lse_is_what_the_flash_backward_reads():
    """lse_for_flash(flashinfer's LSE) against FlashAttention-2's own forward LSE for the same inputs: same layout
    and units. Not the same bits: the two kernels' scores differ at bf16 level (max 1.7e-3 of LSEs near 7 on the
    H200), which moves the backward's softmax by as much; test_gradients_... bounds the effect on gradients."""
    from top_rl.kernels import packed_batch
    from top_rl.kernels.sglang import attention as sglang_attention
    from top_rl.kernels.sglang import attention_backward

    lengths = [1, 700, 1300, 64]
    q, k, v = _fused_qkv(sum(lengths), seed=4)
    k, v = k.contiguous(), v.contiguous()
    cu = _cu(lengths)
    batch = packed_batch.packed_batch(cu)
    _, lse = sglang_attention.FlashinferState.get(q.device).run_prefill(q, k, v, batch, D**-0.5, want_lse=True)
    ours = attention_backward.lse_for_flash(lse)
    cu32 = cu.to(torch.int32)
    _, fa_lse, *_ = torch.ops.aten._flash_attention_forward(q, k, v, cu32, cu32, 1300, 1300, 0.0, True, False,
                                                            scale=D**-0.5)
    assert ours.shape == fa_lse.shape, (ours.shape, fa_lse.shape)
    torch.testing.assert_close(ours, fa_lse, rtol=0, atol=4e-3)


def test_gradients_with_the_forward_lse_equal_the_rerun_ones(monkeypatch):
    """The flash backward fed flashinfer's output and LSE against the same backward after a re-run FA2 forward
    (top.fast_paths.flashinfer_lse=false), and both against the fp64 formula."""
    from tests.gpu.test_grads import _attn_ref, _check
    from tests.helpers import with_plan
    from top_rl.kernels.sglang import attention_backward

    with_plan(monkeypatch, attention_backward="flash")
    lengths = [700, 1, 1300, 64]
    cu = _cu(lengths)
    g = torch.Generator(device="cuda").manual_seed(5)
    q, k, v = (torch.randn(sum(lengths), h, D, generator=g, device="cuda").bfloat16() for h in (HQ, HKV, HKV))
    go = torch.randn(sum(lengths), HQ, D, generator=g, device="cuda")
    scale = D**-0.5
    converted = []  # the forward-LSE path really ran for "1" (else both runs re-run and agree trivially)
    convert = attention_backward.lse_for_flash
    monkeypatch.setattr(attention_backward, "lse_for_flash", lambda lse: converted.append(1) or convert(lse))
    grads = {}
    for flag in ("1", "0"):
        with_plan(monkeypatch, flashinfer_lse=flag == "1")
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        before = len(converted)
        kernels.attention(*leaves, cu, scale).float().backward(go)
        assert (len(converted) > before) == (flag == "1"), f"flashinfer_lse={flag}: forward LSE used?"
        grads[flag] = [t.grad for t in leaves]
        _check(lambda a, b, c: kernels.attention(a, b, c, cu, scale), lambda a, b, c: _attn_ref(a, b, c, cu, scale),
               [q, k, v], go, 2e-2)
    for name, a, b in zip("qkv", grads["1"], grads["0"]):
        print(f"d{name}: relative error {rel_err(a, b):.2e} between the forward-LSE and the re-run backward")
        assert rel_err(a, b) < 1e-2, f"d{name}: relative error {rel_err(a, b)} between the two backwards"
    assert not attention_backward._flash_backward_failed, attention_backward._flash_backward_failed
