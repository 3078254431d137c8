"""The `sglang` backend's token log-prob gather kernel (top_rl/kernels/sglang/logprob_triton.py) against what the
engine computes, SGLang's lsm_BI over the whole vocab then gather, bit pattern for bit pattern: fp32 (prefill path)
and bf16 (sampler path) rows, vocab 151936 and odd widths, scales from 1 to near fp32's max, -inf entries, ids at
0 and V-1; batch invariance (a row alone equals the row in a batch); and prefill_logprobs / sample_logprobs through
the backend take the kernel (no silent fall back) with the eager path's bits and gradients.
CPU half: tests/kernels/test_kernels_sglang_logprob_gather.py (dispatch, fall back, the kernel in Triton's interpreter).
"""

from __future__ import annotations

import pytest
import torch

from tests.helpers import with_plan
from tests.gpu._common import needs_cuda
from tests.gpu.test_fused_forward import _assert_bits
from top_rl import kernels
from top_rl.kernels.sglang import backend as sg
from top_rl.kernels.sglang import fused_forward as ff

pytestmark = [needs_cuda, pytest.mark.gpu]

VOCABS = [151936, 32000, 2053, 1001, 7]  # Qwen3's; the GPU tests' model; not multiples of 1024 or of 4
SCALES = [1.0, 30.0, 1e4, 1e37]  # 1e37 * randn clamps to +-3e38: x - max overflows to -inf for some entries


def _gather_module():
    from top_rl.kernels.sglang import logprob_triton as sglang_logprob_triton

    return sglang_logprob_triton


def _lsm_bi_gather(z, ids):
    return sg.ops().log_softmax(z, dim=-1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)


def _rows(rows, vocab, scale, dtype, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = (torch.randn(rows, vocab, generator=g, device="cuda") * scale).clamp(-3e38, 3e38)
    neg = torch.rand(rows, vocab, generator=g, device="cuda") < 0.05
    neg[: rows // 4] = False  # a quarter of the rows without -inf
    x = x.masked_fill(neg, float("-inf"))
    x[rows // 2] = float("-inf")  # one row all -inf but one entry
    x[rows // 2, vocab // 2] = 0.0
    ids = torch.randint(0, vocab, (rows,), generator=g, device="cuda")
    ids[:3] = torch.tensor([0, vocab - 1, vocab // 2], device="cuda")
    ids[rows // 2] = vocab // 2
    return x.to(dtype), ids


@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("vocab", VOCABS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_kernel_bits_equal_lsm_bi_gather(dtype, vocab, scale):
    rows = 3000 if vocab > 10000 else 4097
    z, ids = _rows(rows, vocab, scale, dtype, seed=vocab)
    got = _gather_module().gathered_log_softmax(z, ids)
    _assert_bits(got, _lsm_bi_gather(z, ids), f"gathered lsm_BI {dtype} V={vocab} scale={scale}")


@pytest.mark.parametrize("temperature", [1.0, 0.7, 1.3, 0.01])
@pytest.mark.parametrize("vocab", VOCABS)
def test_sampler_kernel_bits_equal_the_engines(vocab, temperature):
    """The fused sampler pass (bf(f32(L) / T) rounded per loaded block) against what the engine runs: the eager
    division and rounding (_sampler_input), then lsm_BI over the whole vocab, then gather. Scales up to 1e4 (at
    1e37 / T the division overflows to inf, whose NaN log-probs carry no comparable bit pattern)."""
    rows = 3000 if vocab > 10000 else 4097
    for scale in (1.0, 30.0, 1e4):
        logits, ids = _rows(rows, vocab, scale, torch.bfloat16, seed=vocab + int(scale))
        t = torch.full((rows,), temperature, device="cuda")
        t[::7] = 0.9  # per-row temperatures
        got, shift = _gather_module().gathered_sampler_log_softmax(logits, t, ids)
        _assert_bits(got, _lsm_bi_gather(sg._sampler_input(logits, t), ids), f"sampler V={vocab} T={temperature} "
                                                                             f"scale={scale}")
        assert shift.dtype == torch.float32 and shift.shape == (rows,)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_views_and_leading_dims(dtype):
    """A row-offset view (a data pointer not 16-byte aligned: another Triton specialisation, the same for both), a
    column slice (both copy it contiguous) and [B, S, V] logits."""
    z, ids = _rows(513, 1001, 5.0, dtype, seed=1)
    _assert_bits(_gather_module().gathered_log_softmax(z[1:], ids[1:]), _lsm_bi_gather(z[1:], ids[1:]), "offset view")
    zc, idc = z[:, :999], ids.clamp_max(998)
    _assert_bits(_gather_module().gathered_log_softmax(zc, idc), _lsm_bi_gather(zc, idc), "column slice")
    z3, id3 = z[:512].reshape(4, 128, 1001), ids[:512].reshape(4, 128)
    _assert_bits(_gather_module().gathered_log_softmax(z3, id3), _lsm_bi_gather(z3, id3), "[B, S, V]")


def test_batch_invariant():
    z, ids = _rows(4096, 151936, 3.0, torch.float32, seed=2)
    full = _gather_module().gathered_log_softmax(z, ids)
    for n in (1, 3, 1000):
        _assert_bits(_gather_module().gathered_log_softmax(z[-n:].clone(), ids[-n:].clone()), full[-n:],
                     f"last {n} rows alone")


@pytest.fixture
def kernel_calls(monkeypatch):
    """Counts the gather kernel's calls, so a test knows the fast path ran (no fall back)."""
    mod, calls = _gather_module(), []
    real, real_sampler = mod.gathered_log_softmax, mod.gathered_sampler_log_softmax
    monkeypatch.setattr(mod, "gathered_log_softmax", lambda *a: calls.append(a[0].dtype) or real(*a))
    monkeypatch.setattr(mod, "gathered_sampler_log_softmax",
                        lambda *a: calls.append(("sampler", a[0].dtype)) or real_sampler(*a))
    monkeypatch.setattr(ff, "_failed", {})
    monkeypatch.setattr(sg._fused, "_failed", {})
    with_plan(monkeypatch, fused_forward=True, fused_sampler=True)
    return calls


def _out_and_grad(fn, logits, ids, g_out):
    leaf = logits.detach().clone().requires_grad_(True)
    out = fn(leaf, ids)
    out.backward(g_out)
    return out.detach(), leaf.grad


@pytest.mark.parametrize("path", ["prefill", "sampler"])
def test_backend_takes_the_kernel_with_the_eager_bits(monkeypatch, kernel_calls, path):
    logits, ids = _rows(2048, 151936, 4.0, torch.bfloat16, seed=3)
    logits = logits.clamp_min(-1e4)  # the model's logits are finite
    temp = torch.full((2048,), 0.7, device="cuda")
    fn = kernels.prefill_logprobs if path == "prefill" else (lambda x, i: kernels.sample_logprobs(x, i, temp))
    g_out = torch.randn(2048, device="cuda").to(torch.float32 if path == "prefill" else torch.bfloat16)
    fast, fast_grad = _out_and_grad(fn, logits, ids, g_out)
    assert kernel_calls == [torch.float32 if path == "prefill" else ("sampler", torch.bfloat16)], "no kernel ran"
    assert not ff._failed and not sg._fused._failed
    with_plan(monkeypatch, fused_forward=False)
    eager, eager_grad = _out_and_grad(fn, logits, ids, g_out)
    assert len(kernel_calls) == 1
    _assert_bits(fast, eager, f"{path} log-probs through the backend")
    if path == "prefill":  # the same compiled backward on both paths
        assert torch.equal(fast_grad, eager_grad)
    else:  # the fused one-pass backward vs the compiled formula: the same fp32 math, softmax from the kept shift
        torch.testing.assert_close(fast_grad.float(), eager_grad.float(), rtol=2 ** -7,
                                   atol=1e-3 * float(eager_grad.abs().max()))
