"""The `stock` backend (the non-TOP baseline, top_rl/kernels/stock.py) on CPU: the chunked token log-probs against
plain's unchunked torch ones (forward and backward, fp32 and bf16, a chunk that does not divide T, temperatures
other than 1), what their backward keeps, every other op equal to plain's bit for bit on CPU (the CPU baseline's
numbers do not move), a failing fast path falling back to plain's op, and which backend each run side gets.
tests/gpu/test_stock_kernels.py checks the CUDA paths (varlen flash, Liger's RMSNorm) on a GPU."""

from __future__ import annotations

import importlib

import pytest
import torch

from top_rl import config, config_checks, kernels
from top_rl.kernels import fallback, plain, stock

T, V = 37, 301  # a chunk of 8 leaves a last chunk of 5 rows


def _inputs(dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(T, V, generator=g) * 4).to(dtype).requires_grad_()
    ids = torch.randint(0, V, (T,), generator=g)
    temps = torch.rand(T, generator=g) * 1.5 + 0.3  # per-row temperatures, none of them 1
    return logits, ids, temps


PATHS = {  # name -> (stock's chunked op, plain's unchunked op), each (logits, ids, temps) -> log-probs
    "prefill": (lambda L, i, t, c: stock.chunked_prefill_logprobs(L, i, c), lambda L, i, t: plain.prefill_logprobs(L, i)),
    "sampler_per_row_t": (lambda L, i, t, c: stock.chunked_sample_logprobs(L, i, t, c),
                          lambda L, i, t: plain.sample_logprobs(L, i, t)),
    "sampler_scalar_t": (lambda L, i, t, c: stock.chunked_sample_logprobs(L, i, 0.7, c),
                         lambda L, i, t: plain.sample_logprobs(L, i, 0.7)),
    "sampler_0d_t": (lambda L, i, t, c: stock.chunked_sample_logprobs(L, i, torch.tensor(1.3), c),
                     lambda L, i, t: plain.sample_logprobs(L, i, torch.tensor(1.3))),
}
TOL = {torch.float32: dict(rtol=1e-6, atol=1e-6), torch.bfloat16: dict(rtol=0.0, atol=0.0)}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("path", sorted(PATHS))
@pytest.mark.parametrize("chunk", [8, 1, 1024])
def test_chunked_logprobs_equal_the_unchunked_torch_ones(dtype, path, chunk):
    chunked, whole = PATHS[path]
    logits, ids, temps = _inputs(dtype)
    got, want = chunked(logits, ids, temps, chunk), whole(logits, ids, temps)
    assert got.dtype == want.dtype == (torch.float32 if path == "prefill" else dtype)
    assert torch.equal(got, want)  # the same log_softmax per row, gathered: the same bits
    g_out = torch.randn(want.shape, generator=torch.Generator().manual_seed(1)).to(want.dtype)
    (g_got,) = torch.autograd.grad(got, logits, g_out)
    (g_want,) = torch.autograd.grad(want, logits, g_out)
    assert g_got.dtype == g_want.dtype == dtype
    # bf16: the fp32 gradient rounds to the same bf16 value; fp32: within a few ulps of autograd's formula
    torch.testing.assert_close(g_got, g_want, **TOL[dtype])
    assert g_got.abs().sum() > 0


def test_the_chunked_backward_is_the_softmax_formula_divided_by_t():
    """An independent check (not autograd through plain): d lp / d logits = (onehot - softmax(z)) / t."""
    logits, ids, temps = _inputs(torch.float32)
    got = stock.chunked_sample_logprobs(logits, ids, temps, 8)
    (grad,) = torch.autograd.grad(got.sum(), logits)
    t = temps.double()[:, None]
    p = torch.softmax(logits.detach().double() / t, -1)
    want = (torch.nn.functional.one_hot(ids, V).double() - p) / t
    # fp32 arithmetic against fp64: the gradient reaches 1/t ~ 3.3, where 1e-6 is ~8 fp32 ulps; torch 2.13's CPU
    # exp lands 1.03e-6 off on one of 11137 values, so a relative term of ~16 ulps joins the absolute one
    torch.testing.assert_close(grad.double(), want, rtol=2e-6, atol=1e-6)


def test_the_chunked_backward_keeps_no_fp32_vocab_tensor():
    """Between forward and backward only the logits (their own dtype) and the ids are kept; plain keeps the fp32
    [T, V] log-softmax."""
    logits, ids, temps = _inputs(torch.bfloat16)

    def saved_by(fn):
        seen = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: seen.append((t.dtype, tuple(t.shape))) or t,
                                                      lambda t: t):
            fn()
        return seen

    kept = saved_by(lambda: stock.chunked_sample_logprobs(logits, ids, temps, 8))
    assert (torch.float32, (T, V)) not in kept and (torch.bfloat16, (T, V)) in kept
    assert (torch.float32, (T, V)) in saved_by(lambda: plain.sample_logprobs(logits, ids, temps))


def _lengths_batch(dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    lengths = [5, 1, 9, 3]
    cu = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist())
    q, k, v = (torch.randn(sum(lengths), h, 16, generator=g).to(dtype).requires_grad_() for h in (4, 2, 2))
    return q, k, v, cu


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_on_cpu_every_op_is_plains_bit_for_bit(dtype, monkeypatch):
    """The CPU baseline job's numbers (tests/entry's goldens) stay plain's: forwards and gradients."""
    monkeypatch.setattr(fallback, "paths", {})
    q, k, v, cu = _lengths_batch(dtype)
    scale = 16 ** -0.5
    for op in (lambda m: m.attention(q, k, v, cu, scale),
               lambda m: m.rms_norm(q, torch.linspace(0.5, 1.5, 16), 1e-6),
               lambda m: m.rms_norm(q.float(), torch.linspace(0.5, 1.5, 16), 1e-6, out_dtype=torch.float32,
                                    result_dtype=dtype),
               lambda m: m.rms_norm(q, torch.ones(16), 1e-6, residual=q.detach().float()),
               lambda m: m.prefill_logprobs(q.reshape(q.shape[0], -1), cu.new_zeros(q.shape[0])),
               lambda m: m.sample_logprobs(q.reshape(q.shape[0], -1), cu.new_ones(q.shape[0]), 0.6),
               lambda m: m.silu_and_mul(q), lambda m: m.linear(q, k[:4, 0])):
        got, want = op(stock), op(plain)
        got, want = (got[0], want[0]) if isinstance(got, tuple) else (got, want)
        assert torch.equal(got, want)
        g_out = torch.randn(got.shape, generator=torch.Generator().manual_seed(2)).to(got.dtype)
        for a, b in zip(torch.autograd.grad(got, (q, k, v), g_out, allow_unused=True),
                        torch.autograd.grad(want, (q, k, v), g_out, allow_unused=True)):
            assert (a is None and b is None) or torch.equal(a, b)
    assert fallback.paths == {"attention": "sdpa_per_sequence", "rms_norm": "torch", "prefill_logprobs": "torch",
                              "sample_logprobs": "torch"}


def test_a_fast_path_that_raises_falls_back_to_plains_op_for_good(monkeypatch):
    monkeypatch.setattr(stock, "_failed", {})
    monkeypatch.setattr(fallback, "paths", {})
    monkeypatch.setattr(fallback, "fallbacks", {})
    calls = []

    def broken(x):
        calls.append(x)
        raise RuntimeError("FlashAttention only supports Ampere GPUs or newer")

    with pytest.warns(RuntimeWarning, match="stock attention .flash_varlen. failed.*Ampere.*plain's sdpa"):
        assert stock._fast("attention", "flash_varlen", broken, "sdpa_per_sequence", lambda x: x + 1, 1) == 2
    assert stock._fast("attention", "flash_varlen", broken, "sdpa_per_sequence", lambda x: x + 1, 5) == 6
    assert calls == [1]  # not tried again
    assert fallback.paths == {"attention": "sdpa_per_sequence"} and "Ampere" in fallback.fallbacks["attention"]
    with pytest.raises(torch.OutOfMemoryError):  # never hidden: plain's op would need more memory
        stock._fast("rms_norm", "liger", lambda: (_ for _ in ()).throw(torch.OutOfMemoryError("oom")), "torch",
                    lambda: None)


def test_liger_absent_is_said_not_raised(monkeypatch):
    monkeypatch.setattr(stock, "_liger", {})
    found = stock.liger_rms_norm_function()
    if importlib.util.find_spec("liger_kernel") is None:
        assert found is None and "liger_kernel" in stock._liger["error"]
    else:
        assert found is not None


def test_the_backend_table():
    """Which backend each side runs: the contract's kernels under TOP, `stock` for the baseline; every backend
    module this CPU can import defines every op of the seam; `plain` and `stock` are not a TOP choice."""
    assert kernels.available_backends() == ["plain", "reference", "sglang", "stock"]
    cfg = config.RunConfig()
    assert config.kernel_backend(cfg) == "reference"
    cfg.top.enabled = False
    assert config.kernel_backend(cfg) == "stock"
    assert config_checks._CHOICES["top.kernels"] == ("reference", "sglang")
    ops = ("linear", "row_linear", "rms_norm", "rope", "silu_and_mul", "attention", "decode_attention",
           "prefill_logprobs", "sample_logprobs", "sampler_log_softmax")
    for name in ("reference", "plain", "stock"):
        module = importlib.import_module(kernels._BACKEND_MODULES[name])
        assert all(callable(getattr(module, op, None)) for op in ops), name


def test_the_flash_wrapper_passes_the_packed_batch_as_flash_takes_it(monkeypatch):
    """The varlen call's plumbing, with stand-ins for aten's flash ops (the kernels themselves need CUDA:
    tests/gpu/test_stock_kernels.py): cu_seqlens as int32, the longest sequence, causal, no dropout, the scale, K/V
    unexpanded (GQA native), and the backward fed the forward's own output and log-sum-exp."""
    q, k, v, cu = _lengths_batch(torch.bfloat16)
    scale = 16 ** -0.5
    seen = {}

    def forward(q_, k_, v_, cu_q, cu_k, max_q, max_k, dropout, causal, debug, *, scale):
        seen["fwd"] = (cu_q.dtype, cu_q.tolist(), cu_k is cu_q, max_q, max_k, dropout, causal, debug, scale,
                       k_.shape[1])
        out = plain.attention(q_, k_, v_, cu, scale)
        return out, torch.full((q_.shape[1], q_.shape[0]), 7.0), torch.zeros(2), torch.zeros(0), torch.zeros(0)

    def backward(g, q_, k_, v_, out, lse, cu_q, cu_k, max_q, max_k, dropout, causal, rng, unused, *, scale):
        seen["bwd"] = (bool((lse == 7.0).all()), torch.equal(out, plain.attention(q_, k_, v_, cu, scale)), max_q,
                       causal, g.is_contiguous())
        return torch.ones_like(q_), torch.full_like(k_, 2.0), torch.full_like(v_, 3.0)

    monkeypatch.setattr(torch.ops.aten, "_flash_attention_forward", forward)
    monkeypatch.setattr(torch.ops.aten, "_flash_attention_backward", backward)
    out = stock.flash_attention(q, k, v, cu, scale)
    assert seen["fwd"] == (torch.int32, cu.tolist(), True, 9, 9, 0.0, True, False, scale, 2)
    assert torch.equal(out, plain.attention(q, k, v, cu, scale))
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), torch.ones_like(out).transpose(0, 1).contiguous().transpose(0, 1))
    assert seen["bwd"] == (True, True, 9, True, True)
    assert (dq == 1).all() and (dk == 2).all() and (dv == 3).all()
