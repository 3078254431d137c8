"""`rms_norm(..., result_dtype=c)`: the residual-stream norms hand their next GEMM an output already rounded to the
compute dtype (top_rl/train/layers.py ResidualNorm). It must be the bits of the fp32 output rounded by `.to(c)`, as
the GEMM did before, with the same gradients. On CPU: the reference and plain backends and the sglang backend's
eager chain; the Triton kernel's bits on the GPU: tests/gpu/test_fused_forward.py."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import use_backend, with_plan

from top_rl import kernels
from top_rl.kernels.sglang import fused_forward as ff

EPS = 1e-6


def _inputs(residual, seed=0, shape=(9, 64)):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(shape, generator=g) * 3).to(torch.float32)  # the fp32 residual stream
    w = 1 + 0.1 * torch.randn(shape[-1], generator=g)
    r = torch.randn(shape, generator=g) if residual else None
    return x, w, r


def _run(fn, x, w, r, grads):
    leaves = [t.detach().clone().requires_grad_() for t in (x, w) + ((r,) if r is not None else ())]
    out = fn(*leaves)
    outs = out if isinstance(out, tuple) else (out,)
    torch.autograd.backward(outs, [g.to(o.dtype) for g, o in zip(grads, outs)])
    return [o.detach() for o in outs], [leaf.grad for leaf in leaves]


@pytest.mark.parametrize("backend", ["reference", "plain"])
@pytest.mark.parametrize("residual", [False, True], ids=["no_res", "res"])
def test_rounded_output_and_grads_equal_a_cast_after(backend, residual):
    x, w, r = _inputs(residual)
    g = torch.Generator().manual_seed(1)
    grads = [torch.randn(x.shape, generator=g).bfloat16().float(), torch.randn(x.shape, generator=g)]

    def cast_after(*a):
        out = kernels.rms_norm(a[0], a[1], EPS, a[2] if residual else None, out_dtype=torch.float32)
        return (out[0].to(torch.bfloat16), out[1]) if residual else out.to(torch.bfloat16)

    def rounded(*a):
        return kernels.rms_norm(a[0], a[1], EPS, a[2] if residual else None, out_dtype=torch.float32,
                                result_dtype=torch.bfloat16)

    with use_backend(backend):
        (want_out, want_g), (got_out, got_g) = (_run(f, x, w, r, grads) for f in (cast_after, rounded))
    assert got_out[0].dtype == torch.bfloat16
    for a, b in zip(got_out + got_g, want_out + want_g):
        assert a.dtype == b.dtype and torch.equal(a, b)


@pytest.mark.parametrize("residual", [False, True], ids=["no_res", "res"])
def test_eager_chain_rounds_only_the_output(residual):
    x, w, r = _inputs(residual, seed=2)
    plain = ff.rms_norm_eager(x, w, r, EPS, torch.float32, torch.mean)
    rounded = ff.rms_norm_eager(x, w, r, EPS, torch.float32, torch.mean, torch.bfloat16)
    assert torch.equal(rounded[0], plain[0].to(torch.bfloat16))
    for a, b in zip(rounded[1:], plain[1:]):  # new residual, n, rstd, n_cast: what backward uses, untouched
        assert (a is None and b is None) or torch.equal(a, b)


def test_dispatch_passes_the_result_dtype(monkeypatch):
    seen = []
    monkeypatch.setattr(ff, "_rms_norm_fusable", lambda *a: True)
    monkeypatch.setattr(ff, "_failed", {})
    with_plan(monkeypatch, fused_forward=True, fused_sampler=True)

    class Kernels:
        def rms_norm(self, *args):
            seen.append(args[-1])
            return ff.rms_norm_eager(*args)

    monkeypatch.setattr(ff, "_kernels", lambda: Kernels())
    x, w, _ = _inputs(False)
    out = ff.rms_norm(x, w, None, EPS, torch.float32, torch.mean, torch.bfloat16)[0]
    assert seen == [torch.bfloat16] and out.dtype == torch.bfloat16
    ff.rms_norm(x, w, None, EPS, torch.float32, torch.mean, torch.float64)  # not a kernel dtype: the eager chain
    assert seen == [torch.bfloat16]
