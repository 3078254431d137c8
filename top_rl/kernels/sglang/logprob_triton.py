"""Token log-probs of the `sglang` backend without the [tokens, vocab] output: lsm_BI gathered at one id per row.

The engine's log-probs are SGLang 0.5.11's batch-invariant `log_softmax` (lsm_BI:
sglang.srt.batch_invariant_ops.batch_invariant_ops.log_softmax, kernel `_log_softmax_kernel`). The trainer needs
one column of it per row, so writing the whole [T, V] output (fp32 at V=151936: ~10 GB per 16k tokens) only to
gather from it is most of the op's time. `_gathered_log_softmax` below repeats lsm_BI's per-row arithmetic and
stores only out[row] = x[row, id] - max_val - log_sum_exp, which is element `id` of lsm_BI's row: the same bits,
because every choice that decides them is pinned to lsm_BI's:
  - one program per row, row index int64, row pointer = base + row * stride: the same addresses;
  - BLOCK_SIZE 1024, and the row stride and n_cols passed as constexpr as lsm_BI passes them: Triton picks the
    register layout of a loaded block (elements per thread, hence tl.sum's reduction tree) from the block shape,
    the loaded dtype and what it can prove about pointer alignment and mask constancy, so all of these must match;
  - pass 1: max of the first block loaded with other=-inf, then max(maximum(block, max_val)) per further block;
    pass 2: sum_exp starts as tl.sum of a zero vector in max_val's dtype, then += sum(where(mask, exp(x - max_val),
    0)) per block, blocks loaded with other=0.0; log_sum_exp = log(sum_exp): the same ops in the same order;
  - the input dtype: the tensor lsm_BI gets (fp32 on the prefill path, bf16 on the sampler path) is reduced
    as is; tl.max promotes bf16 to fp32 there as in lsm_BI, and the result is stored in the input's dtype
    (lsm_BI's output is empty_like(input)), so a bf16 row rounds the same fp32 value the same way;
  - Triton's default launch (num_warps=4, num_stages=3) and default compile options, fp-fusion included, as
    lsm_BI's launch leaves them (the fused forwards' enable_fp_fusion=False would be wrong here).
An id outside [0, V) gives NaN (torch's gather would raise on the device; NaN fails the log-prob gate visibly).
tests/gpu/test_logprob_gather.py compares bit patterns with lsm_BI(x).gather on the GPU.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_SIZE = 1024  # lsm_BI's block size: it fixes the per-block reductions, so it is part of the bits


@triton.jit
def _gathered_log_softmax(x_ptr, ids_ptr, out_ptr, x_row_stride: tl.constexpr, n_cols: tl.constexpr,
                          BLOCK_SIZE: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    row_ptr = x_ptr + row * x_row_stride

    cols = tl.arange(0, BLOCK_SIZE)  # pass 1: the row's max, the first block seeding it
    max_val = tl.max(tl.load(row_ptr + cols, mask=cols < n_cols, other=-float("inf")))
    for start in range(BLOCK_SIZE, n_cols, BLOCK_SIZE):
        cols = start + tl.arange(0, BLOCK_SIZE)
        block = tl.load(row_ptr + cols, mask=cols < n_cols, other=-float("inf"))
        max_val = tl.max(tl.maximum(block, max_val))

    sum_exp = tl.sum(tl.zeros([1], dtype=max_val.dtype))  # pass 2: sum of exp(x - max), block by block
    for start in range(0, n_cols, BLOCK_SIZE):
        cols = start + tl.arange(0, BLOCK_SIZE)
        mask = cols < n_cols
        block = tl.load(row_ptr + cols, mask=mask, other=0.0)
        sum_exp += tl.sum(tl.where(mask, tl.exp(block - max_val), 0.0))
    log_sum_exp = tl.log(sum_exp)

    token = tl.load(ids_ptr + row)
    ok = (token >= 0) & (token < n_cols)
    x = tl.load(row_ptr + token, mask=ok, other=float("nan"))
    tl.store(out_ptr + row, x - max_val - log_sum_exp)


def gathered_log_softmax(z: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """lsm_BI(z, dim=-1).gather(-1, ids[..., None])[..., 0], in z's dtype, shape ids.shape (= z.shape[:-1])."""
    if ids.shape != z.shape[:-1]:
        raise ValueError(f"ids shape {tuple(ids.shape)} must be the logits' leading shape {tuple(z.shape[:-1])}")
    z2 = z.reshape(-1, z.shape[-1]).contiguous()  # lsm_BI's own reshape + contiguous: the same tensor, same pointer
    n_rows, n_cols = z2.shape
    out = torch.empty(n_rows, dtype=z.dtype, device=z.device)
    if n_rows:
        _gathered_log_softmax[(n_rows,)](z2, ids.reshape(-1).to(torch.int64).contiguous(), out, z2.stride(0), n_cols,
                                         BLOCK_SIZE=BLOCK_SIZE)
    return out.reshape(ids.shape)


# ------------------------------------------------------------------------------------------- the sampler path
# The sampler path's lsm_BI input is bf(f32(L) / T) (docs/numerics.md §6.2): torch divides the bf16 logits by the
# fp32 temperature in fp32 (IEEE division) and rounds to bf16, two [rows, vocab] passes before lsm_BI reads the
# result. `_tempered` computes the same value from each loaded block: the loads are of the same dtype, shape and
# alignment as lsm_BI's loads of that tensor (so the same register layout), the -inf / 0 fills map to -inf / 0 as
# lsm_BI's fills of the rounded tensor, and div_rn plus round-to-nearest-even are torch's operations. Everything
# after the load is `_gathered_log_softmax` line for line. Bit patterns: tests/gpu/test_logprob_gather.py.
@triton.jit
def _tempered(x, t):
    return tl.math.div_rn(x.to(tl.float32), t).to(x.dtype)


@triton.jit
def _gathered_sampler_log_softmax(l_ptr, t_ptr, ids_ptr, out_ptr, shift_ptr, x_row_stride: tl.constexpr,
                                  n_cols: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    row_ptr = l_ptr + row * x_row_stride
    t = tl.load(t_ptr + row)

    cols = tl.arange(0, BLOCK_SIZE)
    max_val = tl.max(_tempered(tl.load(row_ptr + cols, mask=cols < n_cols, other=-float("inf")), t))
    for start in range(BLOCK_SIZE, n_cols, BLOCK_SIZE):
        cols = start + tl.arange(0, BLOCK_SIZE)
        block = _tempered(tl.load(row_ptr + cols, mask=cols < n_cols, other=-float("inf")), t)
        max_val = tl.max(tl.maximum(block, max_val))

    sum_exp = tl.sum(tl.zeros([1], dtype=max_val.dtype))
    for start in range(0, n_cols, BLOCK_SIZE):
        cols = start + tl.arange(0, BLOCK_SIZE)
        mask = cols < n_cols
        block = _tempered(tl.load(row_ptr + cols, mask=mask, other=0.0), t)
        sum_exp += tl.sum(tl.where(mask, tl.exp(block - max_val), 0.0))
    log_sum_exp = tl.log(sum_exp)

    token = tl.load(ids_ptr + row)
    ok = (token >= 0) & (token < n_cols)
    x = _tempered(tl.load(row_ptr + token, mask=ok, other=float("nan")), t)
    tl.store(out_ptr + row, x - max_val - log_sum_exp)
    tl.store(shift_ptr + row, (max_val + log_sum_exp).to(tl.float32))  # for the backward only (not the engine's)


def gathered_sampler_log_softmax(logits: torch.Tensor, temperature: torch.Tensor, ids: torch.Tensor):
    """(lsm_BI(bf(f32(logits) / T)).gather(ids), shift) for 2-D bf16 logits, T fp32 per row, int64 ids: the log-probs
    in bf16 and, per row, the fp32 max + log-sum-exp the backward needs (sampler_log_softmax_grad)."""
    if logits.dim() != 2 or ids.shape != logits.shape[:1] or temperature.numel() != logits.shape[0]:
        raise ValueError(f"logits {tuple(logits.shape)}, ids {tuple(ids.shape)}, temperature "
                         f"{tuple(temperature.shape)}: want [rows, vocab], [rows], one temperature per row")
    l2 = logits.contiguous()  # as _sampler_input's output: a fresh contiguous [rows, vocab] tensor
    n_rows, n_cols = l2.shape
    out = torch.empty(n_rows, dtype=l2.dtype, device=l2.device)
    shift = torch.empty(n_rows, dtype=torch.float32, device=l2.device)
    if n_rows:
        _gathered_sampler_log_softmax[(n_rows,)](l2, temperature.reshape(-1).to(torch.float32).contiguous(),
                                                 ids.to(torch.int64).contiguous(), out, shift, l2.stride(0), n_cols,
                                                 BLOCK_SIZE=BLOCK_SIZE)
    return out, shift


GRAD_BLOCK = 2048


@triton.jit
def _sampler_log_softmax_grad(l_ptr, t_ptr, ids_ptr, shift_ptr, g_ptr, grad_ptr, x_row_stride, n_cols,
                              BLOCK: tl.constexpr):
    """d/dL of g * log_softmax(bf(L / T))[id] = (onehot - softmax(z)) * g / T, z rounded as in the forward, softmax
    from the forward's shift: one read of L and one write per element (gradients need not be bitwise)."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    t = tl.load(t_ptr + row)
    z = _tempered(tl.load(l_ptr + row * x_row_stride + cols, mask=mask, other=0.0), t).to(tl.float32)
    p = tl.exp(z - tl.load(shift_ptr + row))
    scale = tl.load(g_ptr + row).to(tl.float32) / t
    hit = tl.where(cols == tl.load(ids_ptr + row), 1.0, 0.0)
    tl.store(grad_ptr + row * x_row_stride + cols, ((hit - p) * scale).to(grad_ptr.dtype.element_ty), mask=mask)


def sampler_log_softmax_grad(logits, temperature, ids, shift, g):
    l2 = logits.contiguous()
    n_rows, n_cols = l2.shape
    grad = torch.empty_like(l2)
    if n_rows:
        _sampler_log_softmax_grad[(n_rows, triton.cdiv(n_cols, GRAD_BLOCK))](
            l2, temperature.reshape(-1).to(torch.float32).contiguous(), ids.to(torch.int64).contiguous(), shift,
            g.reshape(-1).contiguous(), grad, l2.stride(0), n_cols, BLOCK=GRAD_BLOCK)
    return grad
