"""The `stock` backend's CUDA paths (the non-TOP baseline's trainer, top_rl/kernels/stock.py) against plain's torch
ops, within bf16 tolerance, forward and backward, and each fast path really taken (no silent fallback):
  - the varlen FlashAttention-2 call over the packed batch against per-sequence SDPA (GQA, lengths 1 to 1300);
  - Liger's RMSNorm against plain's (the residual-stream norm: fp32 in, bf16 out; the q/k norm: bf16 in, fp32 out);
  - the chunked token log-probs against plain's full-vocab ones (prefill and sampler path, a chunk not dividing T).
Seconds on an H200: `PYTEST_PATHS=tests/gpu/test_stock_kernels.py bash scripts/gpu_run.sh tests`."""

from __future__ import annotations

import pytest
import torch

from tests.gpu._common import needs_cuda, rel_err
from top_rl.kernels import fallback, plain, stock

pytestmark = [needs_cuda, pytest.mark.gpu]


@pytest.fixture(autouse=True)
def fresh_record(monkeypatch):
    monkeypatch.setattr(stock, "_failed", {})
    monkeypatch.setattr(fallback, "paths", {})
    monkeypatch.setattr(fallback, "fallbacks", {})


def _grads(out, inputs, g_out):
    return torch.autograd.grad(out, inputs, g_out)


def test_varlen_flash_equals_per_sequence_sdpa():
    lengths = [700, 1, 1300, 64, 3]
    t = sum(lengths)
    cu = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), device="cuda")
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(t, h, 128, generator=g, device="cuda").bfloat16().requires_grad_() for h in (16, 8, 8))
    g_out = torch.randn(t, 16, 128, generator=g, device="cuda").bfloat16()
    scale = 128 ** -0.5
    got = stock.attention(q, k, v, cu, scale)
    assert fallback.paths["attention"] == "flash_varlen" and not fallback.fallbacks, fallback.fallbacks
    want = plain.attention(q, k, v, cu, scale)
    assert got.shape == want.shape and got.dtype == want.dtype == torch.bfloat16
    assert rel_err(got, want) < 1e-2, rel_err(got, want)
    for name, a, b in zip("qkv", _grads(got, (q, k, v), g_out), _grads(want, (q, k, v), g_out)):
        assert a.dtype == b.dtype and rel_err(a, b) < 2e-2, (name, rel_err(a, b))


@pytest.mark.parametrize("kind", ["residual_norm", "qk_norm"])
def test_liger_rms_norm_equals_plains(kind):
    if stock.liger_rms_norm_function() is None:
        pytest.skip(f"liger_kernel not importable here: {stock._liger['error']}")
    g = torch.Generator(device="cuda").manual_seed(1)
    w = (1.0 + 0.1 * torch.randn(128 if kind == "qk_norm" else 1024, generator=g, device="cuda")).requires_grad_()
    if kind == "residual_norm":  # fp32 stream in, the next GEMM's bf16 out (ResidualNorm)
        x, kw = torch.randn(3000, 1024, generator=g, device="cuda"), dict(out_dtype=torch.float32,
                                                                          result_dtype=torch.bfloat16)
    else:  # per-head bf16 projection in, fp32 out for RoPE (QKNorm)
        x, kw = torch.randn(3000, 16, 128, generator=g, device="cuda").bfloat16(), {}
    x.requires_grad_()
    got = stock.rms_norm(x, w, 1e-6, **kw)
    assert fallback.paths["rms_norm"] == "liger" and not fallback.fallbacks, fallback.fallbacks
    want = plain.rms_norm(x, w, 1e-6, **kw)
    assert got.shape == want.shape and got.dtype == want.dtype
    assert rel_err(got, want) < 1e-2, rel_err(got, want)
    g_out = torch.randn(want.shape, generator=g, device="cuda").to(want.dtype)
    for name, a, b in zip(("x", "w"), _grads(got, (x, w), g_out), _grads(want, (x, w), g_out)):
        assert a.dtype == b.dtype and rel_err(a, b) < 2e-2, (name, rel_err(a, b))


@pytest.mark.parametrize("path", ["prefill", "sampler"])
def test_chunked_logprobs_equal_plains_on_the_gpu(path):
    rows, vocab = 2500, 151936  # CHUNK_ROWS does not divide 2500
    g = torch.Generator(device="cuda").manual_seed(2)
    logits = (torch.randn(rows, vocab, generator=g, device="cuda") * 3).bfloat16().requires_grad_()
    ids = torch.randint(0, vocab, (rows,), generator=g, device="cuda")
    temps = torch.rand(rows, generator=g, device="cuda") + 0.5
    if path == "prefill":
        got, want = stock.prefill_logprobs(logits, ids), plain.prefill_logprobs(logits, ids)
    else:
        got, want = stock.sample_logprobs(logits, ids, temps), plain.sample_logprobs(logits, ids, temps)
    op = "prefill_logprobs" if path == "prefill" else "sample_logprobs"
    assert fallback.paths[op] == "chunked" and not fallback.fallbacks, fallback.fallbacks
    atol = 1e-5 if path == "prefill" else 0.07  # the sampler's are bf16: one step at |lp| ~ 12 is 0.0625
    assert got.dtype == want.dtype and torch.allclose(got.float(), want.float(), rtol=0.0, atol=atol)
    g_out = torch.randn(want.shape, generator=g, device="cuda").to(want.dtype)
    (a,), (b,) = _grads(got, (logits,), g_out), _grads(want, (logits,), g_out)
    assert a.dtype == b.dtype == torch.bfloat16 and rel_err(a, b) < 1e-2, rel_err(a, b)
