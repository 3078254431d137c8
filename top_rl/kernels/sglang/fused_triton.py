"""Triton forwards of the `sglang` backend's RMSNorm and SiLU-and-mul, bitwise equal to the eager ops they replace.

The engine (SGLang in rl mode) runs these forwards as chains of eager torch ops; their bits are the contract.
Every op of those chains is exactly rounded IEEE fp32 arithmetic, so a kernel doing the same ops on the same
operands in the same order yields the same bits, whatever it fuses, provided that it:
  - never contracts a*b+c into an FMA: every launch passes enable_fp_fusion=False (mul.rn / add.rn);
  - rounds fp32 -> bf16/fp16 to nearest even, as torch's casts do (Triton's default downcast, cvt.rn);
  - calls no approximate instruction where torch is exact (tl.exp is ex2.approx and `/` is div.full).

RMSNorm (RMSNorm.forward_native, fp32 weight, cast_x_before_out_mul, fp32 residual):
  eager: xf = f32(x) [+ f32(residual)]; new_residual = xf; sq = xf.pow(2); rstd = rsqrt(mean_BI(sq) + eps);
         n = xf * rstd; n_cast = round_orig(n); out = w * n_cast
  here:  `_rms_square` writes xf (only with a residual: it is new_residual) and sq = xf * xf (torch's pow(2) is
         base * base); mean_BI and rsqrt stay the caller's eager calls on the same sq (mean_BI's reduction order
         is the contract); rows of 128 (the q/k norms) take `_head_mean`, which repeats mean_BI's reduction
         (below; top.fast_paths.fused_head_mean=false: mean_BI itself); `_rms_scale` recomputes nothing but
         reloads xf, then n = xf * rstd, n_cast, out = w * n_cast.
SiLU-and-mul (SiluAndMul.forward_native: F.silu(g[..., :d]) * g[..., d:]):
  torch's CUDA silu is x / (1 + exp(-x)) in fp32 opmath with the accurate expf (libdevice __nv_expf) and IEEE
  division (div.rn), rounded to the input dtype; the mul converts both operands to fp32, multiplies, rounds.
  `_silu_mul` does exactly that: libdevice.exp, tl.math.div_rn, round, fp32 mul, round. (__nv_expf ends by
  multiplying by a power of two, exact short of underflow, so FMA contraction of `1 + exp` could not change its
  bits either; 1 + a subnormal rounds to 1 with or without flush-to-zero.)
tests/gpu/test_fused_forward.py proves it on the GPU: SiLU-and-mul over every finite bf16 gate value, RMSNorm
over the model's shapes with and without residual, bit patterns compared.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from top_rl.kernels import plan as _plan

BLOCK = 1024


# Triton's CPU interpreter (TRITON_INTERPRET=1, CPU tests) has no libdevice: there `_silu_mul` uses tl.exp.
INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _launch_options() -> dict:
    opts = {"enable_fp_fusion": False}
    if INTERPRET:
        return opts
    try:  # libdevice's non-FTZ paths, as nvcc builds torch's kernels (the option is newer than some Triton releases)
        from triton.backends.nvidia.compiler import CUDAOptions

        if "enable_reflect_ftz" in CUDAOptions.__dataclass_fields__:
            opts["enable_reflect_ftz"] = False
    except ImportError:
        pass
    return opts


OPTIONS = _launch_options()


@triton.jit
def _rms_square(x_ptr, r_ptr, xf_ptr, sq_ptr, numel, HAS_RES: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
    xf = tl.load(x_ptr + offs, mask=mask).to(tl.float32)
    if HAS_RES:
        xf = xf + tl.load(r_ptr + offs, mask=mask).to(tl.float32)
        tl.store(xf_ptr + offs, xf, mask=mask)
    tl.store(sq_ptr + offs, xf * xf, mask=mask)


@triton.jit
def _rms_scale(src_ptr, rstd_ptr, w_ptr, n_ptr, cast_ptr, out_ptr, numel, N: tl.constexpr, CAST: tl.constexpr,
               BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
    xf = tl.load(src_ptr + offs, mask=mask).to(tl.float32)
    rstd = tl.load(rstd_ptr + offs // N, mask=mask)
    w = tl.load(w_ptr + offs % N, mask=mask).to(tl.float32)
    n = xf * rstd
    tl.store(n_ptr + offs, n, mask=mask)
    if CAST:
        n_cast = n.to(cast_ptr.dtype.element_ty)
        tl.store(cast_ptr + offs, n_cast, mask=mask)
        out = w * n_cast.to(tl.float32)
    else:
        out = w * n
    tl.store(out_ptr + offs, out.to(out_ptr.dtype.element_ty), mask=mask)


# mean_BI (SGLang's `mean_kernel`) runs one program per row with one 1024-wide block: for the per-head q/k norms
# (rows of head_dim = 128) that is T x heads programs with 7/8 of every load masked, SGLang's slowest kernel in the
# trainer step. `_head_mean` takes HEAD_ROWS rows per program and gives mean_kernel's bits, by the same reduction:
#   - mean_kernel's fp32 block of 1024 (4 contiguous elements per thread, 128 threads, two repetitions): a row of 128
#     lies in warp 0's first repetition, 4 consecutive elements per lane; each thread adds its registers in order
#     (the zeros of the masked repetition add exactly), warp 0 reduces across its 32 lanes, the other warps add
#     zeros; `acc = 0.0 + sum` adds zero to a non-negative sum (squares), exactly.
#   - here a [HEAD_ROWS, 128] fp32 block: 4 contiguous elements per thread, 32 lanes across a row, warps across rows,
#     so each row's sum is the same within-thread additions and the same cross-lane reduction;
#   - mean = sum / N with N a runtime int, as mean_kernel divides (Triton's default options, as its launch).
# tests/kernels/test_kernels_head_mean_tree.py checks that structure in the sm_90 LLVM IR of both kernels (on CPU);
# tests/gpu/test_fused_forward.py compares bit patterns with mean_BI on the H200 (bench/head_mean.py: 4.5x faster on
# the 0.6B q norm). top.fast_paths.fused_head_mean=false runs mean_BI instead (A/B).
HEAD_DIM = 128
HEAD_ROWS = 32


@triton.jit
def _head_mean(x_ptr, out_ptr, n_rows, N, ROWS: tl.constexpr, D: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, D)
    ok = rows < n_rows
    vals = tl.load(x_ptr + rows[:, None] * D + cols[None, :], mask=ok[:, None], other=0.0)
    tl.store(out_ptr + rows, tl.sum(vals, axis=1) / N, mask=ok)


def head_mean(sq: torch.Tensor) -> torch.Tensor:
    """mean_BI(sq, -1, keepdim=True) for contiguous fp32 rows of HEAD_DIM."""
    assert sq.dtype == torch.float32 and sq.shape[-1] == HEAD_DIM and sq.is_contiguous()
    n_rows = sq.numel() // HEAD_DIM
    out = torch.empty((*sq.shape[:-1], 1), dtype=torch.float32, device=sq.device)
    if n_rows:
        _head_mean[(triton.cdiv(n_rows, HEAD_ROWS),)](sq, out, n_rows, HEAD_DIM, ROWS=HEAD_ROWS, D=HEAD_DIM)
    return out


def _mean(sq, mean):
    if sq.shape[-1] == HEAD_DIM and _plan.current().fast_paths.fused_head_mean:  # off: mean_BI for rows of 128 too
        return head_mean(sq)
    return mean(sq, -1, keepdim=True)


@triton.jit
def _silu_mul(g_ptr, out_ptr, row_stride, D: tl.constexpr, BLOCK: tl.constexpr, LIBDEVICE: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < D
    a = tl.load(g_ptr + row * row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(g_ptr + row * row_stride + D + cols, mask=mask, other=0.0).to(tl.float32)
    if LIBDEVICE:
        e = libdevice.exp(-a)
    else:
        e = tl.exp(-a)
    s = tl.math.div_rn(a, 1.0 + e)
    s = s.to(out_ptr.dtype.element_ty).to(tl.float32)
    tl.store(out_ptr + row * D + cols, (s * b).to(out_ptr.dtype.element_ty), mask=mask)


def rms_norm(x, w, residual, eps, orig, mean, result=None):
    """(out, new_residual or None, n, rstd, n_cast) of the eager chain (fused_forward.rms_norm_eager); with
    `result`, out is stored in that dtype (cvt.rn, the bits of the eager chain's `.to(result)`)."""
    x = x.contiguous()
    res = residual.contiguous() if residual is not None else None
    numel, hidden = x.numel(), x.shape[-1]
    grid = (triton.cdiv(numel, BLOCK),)
    sq = torch.empty(x.shape, dtype=torch.float32, device=x.device)
    xf = torch.empty_like(sq) if res is not None else None
    _rms_square[grid](x, res if res is not None else x, xf if xf is not None else sq, sq, numel,
                      HAS_RES=res is not None, BLOCK=BLOCK, **OPTIONS)
    rstd = torch.rsqrt(_mean(sq, mean) + eps)  # mean_BI's bits (per-head rows: `_head_mean`), torch's rsqrt
    del sq
    n = torch.empty(x.shape, dtype=torch.float32, device=x.device)
    cast = orig != torch.float32
    n_cast = torch.empty(x.shape, dtype=orig, device=x.device) if cast else n
    out = torch.empty(x.shape, dtype=result or torch.promote_types(w.dtype, orig), device=x.device)
    _rms_scale[grid](xf if xf is not None else x, rstd, w.contiguous(), n, n_cast, out, numel, N=hidden, CAST=cast,
                     BLOCK=BLOCK, **OPTIONS)
    return out, xf, n, rstd, n_cast


def silu_and_mul(g):
    """F.silu(g[..., :d]) * g[..., d:] in one pass (d = g.shape[-1] // 2), output contiguous in g's dtype."""
    g = g.contiguous()
    d = g.shape[-1] // 2
    rows = g.numel() // g.shape[-1]
    out = torch.empty((*g.shape[:-1], d), dtype=g.dtype, device=g.device)
    _silu_mul[(rows, triton.cdiv(d, BLOCK))](g, out, g.shape[-1], D=d, BLOCK=BLOCK, LIBDEVICE=not INTERPRET,
                                                 **OPTIONS)
    return out
