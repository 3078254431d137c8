"""top.fast_paths.recompute_gemm on CPU: a checkpointed layer's first pass runs the engine's GEMM (mm_BI: its output is
what the loss and the gate see), the recompute inside the backward runs cuBLAS's, and the backward reads the
recompute's activations. mm_BI is a Triton GPU kernel, so a stand-in takes its place here, recording its calls and
landing one bf16 step away from a plain GEMM so which GEMM's output went where is visible. What is checked is the
plumbing; tests/gpu and bench/trainer_step.py run the real kernels."""

from __future__ import annotations

import torch

from tests.helpers import with_plan
from top_rl import kernels
from top_rl.kernels import checkpoint_pass
from top_rl.kernels.sglang import backend
from top_rl.train import recompute

OFFSET = 0.0078125  # the stand-in mm_BI's output = the plain GEMM's + this


def _stand_in(monkeypatch) -> list:
    calls = []

    def mm_bi(x2d, w):
        calls.append(checkpoint_pass.current())
        return x2d @ w.t() + OFFSET

    monkeypatch.setattr(backend, "mm_bi", mm_bi)
    return calls


def _inputs():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 8, generator=g).requires_grad_()
    w1 = torch.randn(16, 8, generator=g).requires_grad_()
    w2 = torch.randn(4, 16, generator=g).requires_grad_()
    return x, w1, w2


def _layer(x, w1, w2, linear=backend.linear):
    # the square's backward reads its input, the first GEMM's output: the recompute's activation reaches the grads
    return linear(linear(x, w1).square(), w2)


def _grads(out, *leaves):
    return torch.autograd.grad(out.square().sum(), leaves)


def test_the_recompute_runs_cublas_and_the_backward_reads_its_activations_while_the_gated_output_is_the_engines(
        monkeypatch):
    with_plan(monkeypatch, recompute_gemm=True)
    calls = _stand_in(monkeypatch)
    x, w1, w2 = _inputs()
    out = recompute.non_reentrant_checkpoint(_layer, False, x, w1, w2)
    assert torch.equal(out, _layer(x, w1, w2, lambda a, b: a @ b.t() + OFFSET))  # the first pass: mm_BI's bits
    assert calls == [checkpoint_pass.FIRST] * 2
    calls.clear()
    got = _grads(out, x, w1, w2)  # torch's checkpoint raises if the two passes saved tensors of other shapes
    assert calls == []  # the recompute ran no mm_BI
    # want: the gated output's gradient, taken back through the same layer run uncheckpointed with a plain GEMM (the
    # activations the recompute's cuBLAS GEMM gives), by the same backward kernels
    gated = out.detach().requires_grad_()
    g_out, = torch.autograd.grad(gated.square().sum(), gated)
    monkeypatch.setattr(backend, "mm_bi", lambda a, b: a @ b.t())
    want = torch.autograd.grad(_layer(x, w1, w2), (x, w1, w2), g_out)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    offset_grads = torch.autograd.grad(_layer(x, w1, w2, lambda a, b: a @ b.t() + OFFSET), (x, w1, w2), g_out)
    assert not torch.equal(got[0], offset_grads[0])  # the engine's activations would have given other gradients
    assert kernels.report()["paths"]["linear_recompute"] == "cublas"  # in run_dir/kernels.json


def test_off_by_default_and_outside_a_checkpoint_every_gemm_is_the_engines(monkeypatch):
    with_plan(monkeypatch)  # recompute_gemm: the default
    calls = _stand_in(monkeypatch)
    x, w1, w2 = _inputs()
    out = recompute.non_reentrant_checkpoint(_layer, False, x, w1, w2)
    _grads(out, x, w1, w2)
    assert calls == [checkpoint_pass.FIRST] * 2 + [checkpoint_pass.RECOMPUTE] * 2

    with_plan(monkeypatch, recompute_gemm=True)
    calls = _stand_in(monkeypatch)
    _grads(_layer(x, w1, w2), x, w1, w2)  # recompute off: no pass, the switch changes nothing
    assert calls == [None, None]
