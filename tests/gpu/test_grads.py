"""Each analytic backward of the `sglang` backend against autograd through a differentiable fp64 formula.

Inputs are bf16 or fp32 as the model feeds them; the fp64 reference is exact, so the tolerance is the
input precision's (bf16 ~1e-2, fp32 ~1e-5), measured as a relative norm error.
"""

from __future__ import annotations

import pytest
import torch

from top_rl import kernels
from tests.gpu._common import needs_cuda, rel_err

pytestmark = [needs_cuda, pytest.mark.gpu]
BF16_TOL, FP32_TOL = 1e-2, 1e-4


def _grads(fn, inputs, g_out):
    """Gradients of sum(fn(*inputs) * g_out) with respect to `inputs` (leaf copies)."""
    leaves = [t.detach().clone().requires_grad_(True) for t in inputs]
    out = fn(*leaves)
    outs = out if isinstance(out, tuple) else (out,)
    gs = g_out if isinstance(g_out, tuple) else (g_out,)
    torch.autograd.backward([o for o in outs], [g.to(o.dtype) for o, g in zip(outs, gs)])
    return outs, [leaf.grad for leaf in leaves]


def _check(ours, ref, inputs, g_out, tol, out_tol=None):
    o1, g1 = _grads(ours, inputs, g_out)
    o2, g2 = _grads(ref, [t.double() for t in inputs], g_out)
    for a, b in zip(o1, o2):
        assert rel_err(a, b) < (out_tol or tol), f"forward rel err {rel_err(a, b)}"
    for i, (a, b) in enumerate(zip(g1, g2)):
        assert a is not None and torch.isfinite(a).all()
        assert a.dtype == inputs[i].dtype
        assert rel_err(a, b) < tol, f"grad {i} rel err {rel_err(a, b)}"


def test_linear():
    x = torch.randn(300, 1024, device="cuda").bfloat16()
    w = (torch.randn(512, 1024, device="cuda") * 0.05).bfloat16()
    g = torch.randn(300, 512, device="cuda")
    _check(kernels.linear, lambda a, b: a @ b.T, [x, w], g, BF16_TOL)
    _check(lambda a, b: kernels.row_linear(a, b, None), lambda a, b: a @ b.T, [x, w], g, BF16_TOL)


def _rms_ref(x, w, eps, residual=None):
    xf = x if residual is None else x + residual
    n = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    out = w * n
    return out if residual is None else (out, xf)


def test_rms_norm_residual_fp32():
    x = torch.randn(64, 1024, device="cuda").bfloat16()
    r = torch.randn(64, 1024, device="cuda")
    w = 1 + 0.1 * torch.randn(1024, device="cuda")
    g = (torch.randn(64, 1024, device="cuda"), torch.randn(64, 1024, device="cuda"))
    _check(lambda a, b, c: kernels.rms_norm(a, b, 1e-6, c, out_dtype=torch.float32),
           lambda a, b, c: _rms_ref(a, b, 1e-6, c), [x, w, r], g, BF16_TOL, out_tol=FP32_TOL)


def test_rms_norm_per_head_bf16_cast():
    q = torch.randn(32, 16, 128, device="cuda").bfloat16()
    w = 1 + 0.1 * torch.randn(128, device="cuda")
    g = torch.randn(32, 16, 128, device="cuda")
    _check(lambda a, b: kernels.rms_norm(a, b, 1e-6), lambda a, b: _rms_ref(a, b, 1e-6), [q, w], g, BF16_TOL)


def test_rope_fp32():
    cos_sin = kernels.rope_cache(128, 1_000_000.0, 4096).cuda()
    x = torch.randn(50, 16, 128, device="cuda")
    pos = torch.randint(0, 4096, (50,), device="cuda")

    def ref(a):
        cos, sin = cos_sin.double()[pos].chunk(2, -1)
        cos, sin = cos[:, None], sin[:, None]
        a1, a2 = a.chunk(2, -1)
        return torch.cat((a1 * cos - a2 * sin, a2 * cos + a1 * sin), -1)

    _check(lambda a: kernels.rope(a, pos, cos_sin), ref, [x], torch.randn_like(x), FP32_TOL)


def test_silu_and_mul():
    gu = torch.randn(64, 2 * 3072, device="cuda").bfloat16()
    ref = lambda a: torch.nn.functional.silu(a[:, :3072]) * a[:, 3072:]  # noqa: E731
    _check(kernels.silu_and_mul, ref, [gu], torch.randn(64, 3072, device="cuda"), BF16_TOL)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("shape", [(1000, 2 * 3072), (7, 2 * 1100), (3, 5, 2 * 9728)])
def test_silu_and_mul_triton_backward(dtype, shape):
    """The Triton backward (swiglu_grad_triton.py) against the fp64 formula, no further from it than the compiled
    formula it replaces is; gates out to +-20, where the sigmoid saturates."""
    from top_rl.kernels import reference
    from top_rl.kernels.sglang import backward as sglang_backward
    from top_rl.kernels.sglang import swiglu_grad_triton

    gen = torch.Generator(device="cuda").manual_seed(11)
    g = (torch.randn(shape, generator=gen, device="cuda") * 5).clamp(-20, 20).to(dtype)
    go = torch.randn(*shape[:-1], shape[-1] // 2, generator=gen, device="cuda").to(dtype)
    exact = reference.silu_and_mul_grad(g.double(), go.double())
    ours = swiglu_grad_triton.silu_and_mul_grad(g, go)
    compiled = sglang_backward._run("silu_and_mul", reference.silu_and_mul_grad, g, go)
    assert ours.dtype == dtype and ours.shape == g.shape and torch.isfinite(ours).all()
    tol = BF16_TOL / 2 if dtype == torch.bfloat16 else 1e-6
    assert rel_err(ours, exact) < tol
    assert rel_err(ours, exact) <= 1.5 * rel_err(compiled, exact) + 1e-7, (rel_err(ours, exact), rel_err(compiled, exact))


@pytest.mark.parametrize("temperature", [None, 1.0, 0.7])
def test_logprobs(temperature):
    logits = (torch.randn(40, 32000, device="cuda") * 3).bfloat16()
    ids = torch.randint(0, 32000, (40,), device="cuda")
    g = torch.randn(40, device="cuda")
    if temperature is None:
        ours = lambda a: kernels.prefill_logprobs(a, ids)  # noqa: E731
        ref = lambda a: torch.log_softmax(a, -1).gather(-1, ids[:, None])[:, 0]  # noqa: E731
        tol = FP32_TOL  # fp32 log-softmax of bf16-exact logits: forward exact up to fp32 rounding
    else:
        ours = lambda a: kernels.sample_logprobs(a, ids, temperature)  # noqa: E731
        # the engine rounds L/T to bf16 before the softmax; the reference does too (straight-through cast)
        ref = lambda a: torch.log_softmax((a / temperature).bfloat16().double(), -1).gather(-1, ids[:, None])[:, 0]  # noqa: E731
        tol = BF16_TOL
    _check(ours, ref, [logits], g, BF16_TOL, out_tol=tol)


def _attn_ref(q, k, v, cu, scale):
    group = q.shape[1] // k.shape[1]
    outs = []
    b = cu.tolist()
    for s, e in zip(b[:-1], b[1:]):
        qs, ks, vs = q[s:e].transpose(0, 1), k[s:e].repeat_interleave(group, 1).transpose(0, 1), v[s:e].repeat_interleave(group, 1).transpose(0, 1)
        sc = (qs @ ks.transpose(1, 2)) * scale
        mask = torch.ones(e - s, e - s, dtype=torch.bool, device=q.device).tril()
        p = torch.softmax(sc.masked_fill(~mask, float("-inf")), -1)
        outs.append((p @ vs).transpose(0, 1))
    return torch.cat(outs)


def test_attention_forward_and_backward():
    lengths = [100, 257, 31, 1]
    t = sum(lengths)
    cu = torch.tensor([0, 100, 357, 388, 389], device="cuda")
    q = torch.randn(t, 16, 128, device="cuda").bfloat16()
    k = torch.randn(t, 8, 128, device="cuda").bfloat16()
    v = torch.randn(t, 8, 128, device="cuda").bfloat16()
    g = torch.randn(t, 16, 128, device="cuda")
    scale = 128**-0.5
    _check(lambda a, b, c: kernels.attention(a, b, c, cu, scale), lambda a, b, c: _attn_ref(a, b, c, cu, scale),
           [q, k, v], g, 2e-2)
