"""The `sglang` backend's fused forwards (top_rl/kernels/sglang/fused_forward.py) on CPU: the dispatch runs the eager
chains off CUDA, with the switch off, and after a failed launch (one warning, not retried); the Triton kernels'
indexing under Triton's CPU interpreter. The bitwise proof on the GPU: tests/gpu/test_fused_forward.py; the eager
chains against SGLang's own forward_native: tests/kernels/test_sglang_native_ops.py."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import interpreted_module, with_plan
from top_rl.kernels.sglang import fused_forward as ff

EPS = 1e-6


def _norm_inputs(residual=True, shape=(5, 64)):
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(shape, generator=g) * 3).bfloat16()
    w = 1 + 0.1 * torch.randn(shape[-1], generator=g)
    r = torch.randn(shape, generator=g) if residual else None
    return x, w, r


def _equal(got, want):
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert (a is None and b is None) or torch.equal(a, b)


class _Kernels:
    """A stand-in for sglang_fused_triton whose launches fail (no GPU here) or report they ran."""

    def __init__(self, error=None):
        self.error, self.calls = error, []

    def rms_norm(self, *args):
        self.calls.append("rms_norm")
        if self.error:
            raise self.error
        return ff.rms_norm_eager(*args)

    def silu_and_mul(self, g):
        self.calls.append("silu_and_mul")
        if self.error:
            raise self.error
        return ff.silu_and_mul_eager(g)


@pytest.fixture
def kernels(monkeypatch):
    k = _Kernels()
    monkeypatch.setattr(ff, "_kernels", lambda: k)
    monkeypatch.setattr(ff, "_failed", {})
    with_plan(monkeypatch, fused_forward=True, fused_sampler=True)
    return k


def test_cpu_tensors_run_the_eager_chain(kernels):
    x, w, r = _norm_inputs()
    _equal(ff.rms_norm(x, w, r, EPS, torch.float32, torch.mean), ff.rms_norm_eager(x, w, r, EPS, torch.float32,
                                                                                     torch.mean))
    g = torch.randn(3, 16).bfloat16()
    assert torch.equal(ff.silu_and_mul(g), ff.silu_and_mul_eager(g))
    assert kernels.calls == []


def _as_cuda(monkeypatch):
    """Make the dispatch take CPU tensors for CUDA ones (the kernels are stand-ins)."""
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))


def test_launch_failure_falls_back_to_eager_once(monkeypatch, kernels):
    kernels.error = RuntimeError("triton: PTX assembly failed")
    x, w, r = _norm_inputs()
    want = ff.rms_norm_eager(x, w, r, EPS, torch.float32, torch.mean)
    _as_cuda(monkeypatch)
    with pytest.warns(RuntimeWarning, match="fused rms_norm forward failed.*PTX assembly failed"):
        _equal(ff.rms_norm(x, w, r, EPS, torch.float32, torch.mean), want)
    _equal(ff.rms_norm(x, w, r, EPS, torch.float32, torch.mean), want)
    assert kernels.calls == ["rms_norm"]  # not retried
    g = torch.randn(3, 16).bfloat16()
    with pytest.warns(RuntimeWarning, match="fused silu_and_mul forward failed"):  # each op falls back on its own
        assert torch.equal(ff.silu_and_mul(g), ff.silu_and_mul_eager(g))
    assert set(ff._failed) == {"rms_norm", "silu_and_mul"}
    from top_rl import kernels as seam

    report = seam.report()  # what the run's metrics count (kernels/fallbacks) and kernels.json names
    assert {"rms_norm", "silu_and_mul"} <= set(report["fallbacks"]) and report["paths"]["rms_norm"] == "fallback"


def test_out_of_memory_is_not_swallowed(monkeypatch, kernels):
    kernels.error = torch.OutOfMemoryError("CUDA out of memory")
    _as_cuda(monkeypatch)
    with pytest.raises(torch.OutOfMemoryError):
        ff.silu_and_mul(torch.randn(3, 16))
    assert not ff._failed


def test_fused_path_taken_on_cuda_and_env_switch_turns_it_off(monkeypatch, kernels):
    x, w, _ = _norm_inputs(residual=False, shape=(5, 4, 32))
    _as_cuda(monkeypatch)
    ff.rms_norm(x, w, None, EPS, torch.bfloat16, torch.mean)
    ff.silu_and_mul(torch.randn(3, 16))
    assert kernels.calls == ["rms_norm", "silu_and_mul"]
    with_plan(monkeypatch, fused_forward=False)
    ff.rms_norm(x, w, None, EPS, torch.bfloat16, torch.mean)
    ff.silu_and_mul(torch.randn(3, 16))
    assert kernels.calls == ["rms_norm", "silu_and_mul"]


def test_shapes_the_kernels_do_not_take_run_eager(monkeypatch, kernels):
    _as_cuda(monkeypatch)
    x, w, r = _norm_inputs()
    ff.rms_norm(x, w.double(), r, EPS, torch.float32, torch.mean)  # fp64 weight
    ff.rms_norm(x, w[:1], r, EPS, torch.float32, torch.mean)  # broadcast weight
    ff.rms_norm(x[:0], w, r[:0], EPS, torch.float32, torch.mean)  # no rows
    ff.silu_and_mul(torch.randn(3, 16, dtype=torch.float64))
    assert kernels.calls == []


# ----------------------------------------------------------------------------- Triton's CPU interpreter
@pytest.fixture
def interpreted(monkeypatch):
    path = ff.__file__.replace("fused_forward.py", "fused_triton.py")
    with interpreted_module(monkeypatch, path, "_top_rl_fused_triton_interpreted") as mod:
        yield mod


@pytest.mark.parametrize("shape,residual", [((7, 64), True), ((7, 64), False), ((3, 4, 32), False)])
def test_interpreted_rms_norm_kernels_equal_eager(interpreted, shape, residual):
    """fp32 output only: the interpreter rounds fp32 -> bf16 by truncation, the GPU to nearest even."""
    x, w, r = _norm_inputs(residual, shape)
    _equal(interpreted.rms_norm(x, w, r, EPS, torch.float32, torch.mean),
           ff.rms_norm_eager(x, w, r, EPS, torch.float32, torch.mean))


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # numpy's exp(89), 3e38 * b: inf, as meant
def test_interpreted_silu_and_mul_indexing(interpreted):
    """fp32, gates whose exp is exact in any implementation (0, >= 104: 0, <= -89: inf), so only the kernel's
    indexing (two halves, rows, a masked block) and its op order can make it differ."""
    g = torch.Generator().manual_seed(1)
    gates = torch.tensor([0.0, -0.0, 104.0, 3e38, -89.0, -3e38, 1e4, -1e4])
    a = gates[torch.randint(0, len(gates), (5, 1030), generator=g)]
    b = torch.randn(5, 1030, generator=g) * 10
    x = torch.cat([a, b], dim=1)
    got, want = interpreted.silu_and_mul(x), ff.silu_and_mul_eager(x)
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))
