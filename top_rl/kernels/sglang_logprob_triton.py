"""Token log-probs of the `sglang` backend without the [tokens, vocab] output: lsm_BI gathered at one id per row.

The engine's log-probs are SGLang 0.5.10.post1's batch-invariant `log_softmax` (lsm_BI:
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
