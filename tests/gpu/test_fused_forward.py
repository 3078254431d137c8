"""The `sglang` backend's fused Triton forwards (top_rl/kernels/sglang/fused_triton.py) against the eager chains the
engine runs (sglang_fused_forward.rms_norm_eager / silu_and_mul_eager), bit pattern for bit pattern: SiLU-and-mul
over every finite bf16 gate value, RMSNorm over the model's shapes with magnitudes from subnormal squares to 1e18,
and the gradients through the backend with the fused forwards on and off. The kernels are called directly (a
silent fall back to eager could not pass), and the backend tests check that the fused path ran.
CPU half: tests/kernels/test_kernels_sglang_fused_forward.py (dispatch, fall back) and tests/kernels/test_sglang_native_ops.py (the
eager chains against SGLang's forward_native).
"""

from __future__ import annotations

import pytest
import torch

from tests.helpers import with_plan
from tests.gpu._common import needs_cuda
from top_rl import kernels
from top_rl.kernels.sglang import fused_forward as ff

pytestmark = [needs_cuda, pytest.mark.gpu]

EPS = 1e-6
_INT = {torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float32: torch.int32}


def _assert_bits(got, want, what):
    """Same dtype, shape and bit pattern (torch.equal would take -0.0 for 0.0)."""
    assert got.dtype == want.dtype and got.shape == want.shape, f"{what}: {got.dtype}{tuple(got.shape)} vs " \
                                                                 f"{want.dtype}{tuple(want.shape)}"
    same = got.contiguous().view(_INT[got.dtype]) == want.contiguous().view(_INT[want.dtype])
    if not bool(same.all()):
        i = int((~same).flatten().nonzero()[0])
        pytest.fail(f"{what}: {int((~same).sum())}/{got.numel()} elements differ; first at flat index {i}: "
                    f"{got.flatten()[i].item()!r} vs {want.flatten()[i].item()!r}")


def _triton():
    from top_rl.kernels.sglang import fused_triton as sglang_fused_triton

    return sglang_fused_triton


def _mean():
    from top_rl.kernels.sglang.backend import ops

    return ops().mean


# ------------------------------------------------------------------------------------------- SiLU-and-mul
def _all_finite_bf16() -> torch.Tensor:
    bits = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16)
    v = bits.view(torch.bfloat16).cuda()
    return v[torch.isfinite(v)]  # 65280 values: +-0, subnormals, normals up to +-3.39e38


def _multipliers(n: int) -> dict[str, torch.Tensor]:
    g = torch.Generator(device="cuda").manual_seed(0)
    every = _all_finite_bf16()
    return {
        "one": torch.ones(n, device="cuda", dtype=torch.bfloat16),  # out = silu(a) exactly: the silu bits alone
        "minus_pi": torch.full((n,), -3.140625, device="cuda", dtype=torch.bfloat16),
        "subnormal": torch.full((n,), 2.0**-130, device="cuda", dtype=torch.bfloat16),  # products underflow
        "huge": torch.full((n,), 1e38, device="cuda", dtype=torch.bfloat16),  # products overflow
        "every_bf16_shuffled": every[torch.randperm(every.numel(), generator=g, device="cuda")],
        "every_bf16_reversed": every.flip(0),
    }


@pytest.mark.parametrize("d", [256, 255])  # 255: a column block that is partly masked
def test_silu_and_mul_every_finite_bf16_gate(d):
    gate = _all_finite_bf16()
    rows = gate.numel() // d
    assert rows * d == gate.numel()
    for name, mult in _multipliers(gate.numel()).items():
        g = torch.cat([gate.view(rows, d), mult.view(rows, d)], dim=1)
        _assert_bits(_triton().silu_and_mul(g), ff.silu_and_mul_eager(g), f"silu_and_mul, multiplier {name}, d={d}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("shape", [(1, 2 * 3072), (1000, 2 * 3072), (3, 5, 2 * 9728), (7, 2 * 1000)], ids=str)
def test_silu_and_mul_random(shape, dtype):
    gen = torch.Generator(device="cuda").manual_seed(1)
    g = (torch.randn(shape, generator=gen, device="cuda") * 4).to(dtype)
    _assert_bits(_triton().silu_and_mul(g), ff.silu_and_mul_eager(g), f"silu_and_mul {dtype} {shape}")


def test_silu_and_mul_strided_input():
    g = torch.randn(64, 2 * 3072 + 8, device="cuda").bfloat16()[:, 8:]  # a row stride the kernel is not told
    _assert_bits(_triton().silu_and_mul(g), ff.silu_and_mul_eager(g), "silu_and_mul of a strided view")


# ------------------------------------------------------------------------------------------------ RMSNorm
def _wide_range(shape, seed, dtype):
    """randn times 10**U(-25, 18) per element: squares from subnormal (and underflowing) to 1e36."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    mag = 10.0 ** (torch.rand(shape, generator=gen, device="cuda") * 43 - 25)
    return (torch.randn(shape, generator=gen, device="cuda") * mag).to(dtype)


SHAPES = [(1024,), (2560,), (16, 128), (8, 128)]  # hidden norms; q/k norms per head


@pytest.mark.parametrize("out_dtype", [torch.float32, None], ids=["out_fp32", "out_x"])  # layer norms; q/k norms
@pytest.mark.parametrize("residual", [False, True], ids=["no_res", "res"])
@pytest.mark.parametrize("x_dtype", [torch.bfloat16, torch.float32], ids=["x_bf16", "x_fp32"])
@pytest.mark.parametrize("tail", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("t", [1, 7, 1000, 4097])
def test_rms_norm_bits(t, tail, x_dtype, residual, out_dtype):
    _check_rms_norm_bits(t, tail, x_dtype, residual, out_dtype)


@pytest.mark.parametrize("result", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("residual", [False, True], ids=["no_res", "res"])
@pytest.mark.parametrize("tail", [s for s in SHAPES if len(s) == 1], ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("t", [1, 1000, 4097])
def test_rms_norm_bits_rounded_result(t, tail, residual, result):
    """The residual-stream norms (fp32 stream, fp32 n) writing their output in the next GEMM's dtype: the eager
    chain's `.to(result)` of the fp32 output, from the kernel's own rounding."""
    _check_rms_norm_bits(t, tail, torch.float32, residual, torch.float32, result)


@pytest.mark.parametrize("out_dtype", [torch.float32, None], ids=["out_fp32", "out_x"])
@pytest.mark.parametrize("x_dtype", [torch.bfloat16, torch.float32], ids=["x_bf16", "x_fp32"])
@pytest.mark.parametrize("tail", [s for s in SHAPES if s[-1] == 128], ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("t", [1, 1000, 4097])
@pytest.mark.parametrize("head_mean", [None, "0"], ids=["default", "mean_bi"])
def test_rms_norm_bits_with_head_mean(monkeypatch, t, tail, x_dtype, out_dtype, head_mean):
    """The q/k norms: by default `_head_mean`'s [..., 1] means through rsqrt and the scale pass; with
    top.fast_paths.fused_head_mean=false, mean_BI's."""
    with_plan(monkeypatch, fused_head_mean=head_mean is None)
    calls = []
    real = _triton().head_mean
    monkeypatch.setattr(_triton(), "head_mean", lambda sq: calls.append(sq.shape) or real(sq))
    _check_rms_norm_bits(t, tail, x_dtype, False, out_dtype)
    assert bool(calls) == (head_mean is None), "_head_mean ran" if calls else "_head_mean did not run"


def _check_rms_norm_bits(t, tail, x_dtype, residual, out_dtype, result=None):
    shape = (t, *tail)
    x = _wide_range(shape, 1, x_dtype)
    r = _wide_range(shape, 2, torch.float32) if residual else None
    gen = torch.Generator(device="cuda").manual_seed(3)
    w = 1.0 + 0.1 * torch.randn(tail[-1], generator=gen, device="cuda")
    orig = out_dtype or x_dtype
    got = _triton().rms_norm(x, w, r, EPS, orig, _mean(), result)
    want = ff.rms_norm_eager(x, w, r, EPS, orig, _mean(), result)
    assert got[0].dtype == want[0].dtype
    for name, a, b in zip(("out", "new_residual", "n", "rstd", "n_cast"), got, want):
        if b is None:
            assert a is None, f"{name}: the eager chain has none"
        else:
            _assert_bits(a, b, f"rms_norm {name} {shape} x {x_dtype} residual={residual} out_dtype={out_dtype}")
    assert got[4] is got[2] if orig == torch.float32 else got[4].dtype == orig


@pytest.mark.parametrize("rows", [1, 31, 33, 16384 * 16 + 5])  # under one program, one and a bit, the 0.6B q norm
def test_head_mean_bits_equal_mean_bi(rows):
    """`_head_mean` (32 rows of 128 per program) against SGLang's mean_BI (one program per row): squares over the
    whole fp32 range, zero rows, an inf and a NaN. (Through rms_norm: test_rms_norm_bits_with_head_mean.)"""
    sq = _wide_range((rows, 128), 4, torch.float32).square()
    sq[rows // 2] = 0.0
    if rows > 40:
        sq[3, 5], sq[7, 9] = float("inf"), float("nan")
    got = _triton().head_mean(sq)
    want = _mean()(sq, -1, keepdim=True)
    same = (got.view(torch.int32) == want.view(torch.int32)) | (torch.isnan(got) & torch.isnan(want))
    assert bool(same.all()), f"{int((~same).sum())}/{rows} row means differ"


# -------------------------------------------------------------------------- through the backend, gradients
@pytest.fixture
def fused_calls(monkeypatch):
    """Counts the fused kernels' calls, so a test knows the fused path ran (no fall back)."""
    calls = {"rms_norm": 0, "silu_and_mul": 0}
    mod = _triton()
    for name in calls:
        real = getattr(mod, name)

        def spy(*a, _real=real, _name=name):
            calls[_name] += 1
            return _real(*a)

        monkeypatch.setattr(mod, name, spy)
    monkeypatch.setattr(ff, "_failed", {})
    return calls


def _grads(fn, inputs, grad_out):
    leaves = [t.detach().clone().requires_grad_(t.is_floating_point()) for t in inputs]
    out = fn(*leaves)
    outs = out if isinstance(out, tuple) else (out,)
    torch.autograd.backward(outs, grad_out)
    return [o.detach() for o in outs], [leaf.grad for leaf in leaves if leaf.requires_grad]


def _fused_and_eager(monkeypatch, fn, inputs, grad_out):
    fused = _grads(fn, inputs, grad_out)
    with_plan(monkeypatch, fused_forward=False)
    eager = _grads(fn, inputs, grad_out)
    with_plan(monkeypatch, fused_forward=True)
    return fused, eager


@pytest.mark.parametrize("case", ["residual", "layer0", "qk", "rounded"])
def test_rms_norm_backend_outputs_and_grads_equal_eager(monkeypatch, fused_calls, case):
    t = 1000
    gen = torch.Generator(device="cuda").manual_seed(4)
    if case == "qk":
        x, w = _wide_range((t, 16, 128), 5, torch.bfloat16), 1 + 0.1 * torch.randn(128, generator=gen, device="cuda")
        fn, inputs = (lambda a, b: kernels.rms_norm(a, b, EPS)), [x, w]
        grad_out = [torch.randn(t, 16, 128, generator=gen, device="cuda")]
    else:
        x, w = _wide_range((t, 1024), 6, torch.bfloat16), 1 + 0.1 * torch.randn(1024, generator=gen, device="cuda")
        grad_out = [torch.randn(t, 1024, generator=gen, device="cuda")]
        if case == "rounded":  # ResidualNorm: output in the compute dtype, the gradient arrives in it
            fn, inputs = (lambda a, b: kernels.rms_norm(a, b, EPS, out_dtype=torch.float32,
                                                        result_dtype=torch.bfloat16)), [x.float(), w]
            grad_out = [grad_out[0].bfloat16()]
        elif case == "residual":
            r = _wide_range((t, 1024), 7, torch.float32)
            fn, inputs = (lambda a, b, c: kernels.rms_norm(a, b, EPS, c, out_dtype=torch.float32)), [x, w, r]
            grad_out.append(torch.randn(t, 1024, generator=gen, device="cuda"))
        else:
            fn, inputs = (lambda a, b: kernels.rms_norm(a, b, EPS, out_dtype=torch.float32)), [x, w]
    (f_out, f_grads), (e_out, e_grads) = _fused_and_eager(monkeypatch, fn, inputs, grad_out)
    assert fused_calls["rms_norm"] == 1, "the fused forward did not run"
    assert not ff._failed
    for i, (a, b) in enumerate(zip(f_out, e_out)):
        _assert_bits(a, b, f"rms_norm ({case}) output {i}")
    for i, (a, b) in enumerate(zip(f_grads, e_grads)):
        assert torch.equal(a, b), f"rms_norm ({case}) gradient of input {i} differs"


def test_silu_and_mul_backend_output_and_grad_equal_eager(monkeypatch, fused_calls):
    from top_rl.kernels.sglang import backward as sglang_backward
    from top_rl.kernels.sglang import swiglu_grad_triton

    backward_calls = []
    real = swiglu_grad_triton.silu_and_mul_grad
    monkeypatch.setattr(swiglu_grad_triton, "silu_and_mul_grad", lambda *a: backward_calls.append(1) or real(*a))
    monkeypatch.setattr(sglang_backward, "_failed", {})
    gen = torch.Generator(device="cuda").manual_seed(8)
    g = (torch.randn(1000, 2 * 3072, generator=gen, device="cuda") * 3).bfloat16()
    go = [torch.randn(1000, 3072, generator=gen, device="cuda").bfloat16()]
    (f_out, f_grads), (e_out, e_grads) = _fused_and_eager(monkeypatch, kernels.silu_and_mul, [g], go)
    assert fused_calls["silu_and_mul"] == 1, "the fused forward did not run"
    assert not ff._failed
    _assert_bits(f_out[0], e_out[0], "silu_and_mul output")
    assert torch.equal(f_grads[0], e_grads[0])
    assert len(backward_calls) == 2 and not sglang_backward._failed, "the Triton backward did not run"
