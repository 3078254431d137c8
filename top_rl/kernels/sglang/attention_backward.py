"""The `sglang` backend's attention backward (every forward kernel): aten's varlen fused attention kernels, called
directly with cu_seqlens and causal masking, so memory is O(L) (no dense mask, no L x L scores).

The backward needs the forward's log-sum-exp: flashinfer's forward returns it (base 2, [T, Hq]; converted by
`lse_for_flash`) and so does fa3's (already [Hq, T], natural log); triton's does not, so for it the flash kernel's own
forward is re-run inside backward for it (no autograd graph is recorded or differentiated there;
top.fast_paths.flashinfer_lse / fa3_lse=false force the re-run for those two too). Gradients need to be right, not
batch-invariant (only forward log-probs are compared bitwise), so the fastest correct kernel is used:
FlashAttention-2 (aten `_flash_attention_*`, GQA native) for bf16/fp16, else memory-efficient attention (K/V heads
repeated, their gradients summed). top.fast_paths.attention_backward=efficient
forces the latter (A/B measurements); a flash call that raises falls back to it for the rest of the process, with a
warning (counted in kernels.report()).
"""

from __future__ import annotations

import functools
import warnings

import torch

from top_rl.kernels import fallback as _fallback
from top_rl.kernels import plan as _plan
from top_rl.kernels.packed_batch import packed_batch


def _expand_kv(t: torch.Tensor, group: int) -> torch.Tensor:
    return t if group == 1 else t.repeat_interleave(group, dim=1)


def efficient_attention_backward(g, q, k, v, cu_seqlens, max_len, scale):
    """(dq, dk, dv) of causal varlen attention through aten's memory-efficient kernels (O(L) memory). Its LSE
    layout is its own, so it always re-runs its forward."""
    group = q.shape[1] // k.shape[1]
    cu = packed_batch(cu_seqlens).cu(torch.int32)
    qb, kb, vb = q.unsqueeze(0), _expand_kv(k, group).unsqueeze(0), _expand_kv(v, group).unsqueeze(0)
    causal_from_top_left = 1
    out, lse, seed, offset, _, _ = torch.ops.aten._efficient_attention_forward(
        qb, kb, vb, None, cu, cu, max_len, max_len, 0.0, causal_from_top_left, True, scale=scale
    )
    dq, dk, dv, _ = torch.ops.aten._efficient_attention_backward(
        g.contiguous().unsqueeze(0), qb, kb, vb, None, out, cu, cu, max_len, max_len, lse, 0.0, seed, offset,
        causal_from_top_left, False, scale=scale,
    )
    dq, dk, dv = dq[0], dk[0], dv[0]
    if group > 1:
        t, hkv, d = k.shape
        dk = dk.reshape(t, hkv, group, d).sum(2)
        dv = dv.reshape(t, hkv, group, d).sum(2)
    return dq, dk.to(k.dtype), dv.to(v.dtype)


def flash_attention_forward(q, k, v, cu_int32, max_len, scale):
    """aten's FlashAttention-2 varlen causal forward, no dropout: (out, lse [Hq, T] fp32 natural log, rng_state, unused,
    debug), what its backward takes. Not the engine's kernel: the backward's re-run, and the recompute's forward under
    top.fast_paths.recompute_attention (attention.py)."""
    return torch.ops.aten._flash_attention_forward(q.contiguous(), k.contiguous(), v.contiguous(), cu_int32, cu_int32,
                                                   max_len, max_len, 0.0, True, False, scale=scale)


def flash_attention_backward(g, q, k, v, cu_seqlens, max_len, scale, out=None, lse=None):
    """(dq, dk, dv) of causal varlen attention through aten's FlashAttention-2 kernels (bf16/fp16, GQA native).
    `out` and `lse` (natural log, [Hq, T] fp32: `lse_for_flash`) from the forward that ran skip the re-run."""
    cu = packed_batch(cu_seqlens).cu(torch.int32)
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    if lse is None:
        out, lse, rng_state, unused, _ = flash_attention_forward(q, k, v, cu, max_len, scale)
    else:
        rng_state = unused = _no_dropout_state(q.device)
    dq, dk, dv = torch.ops.aten._flash_attention_backward(
        g.contiguous(), q, k, v, out.contiguous(), lse, cu, cu, max_len, max_len, 0.0, True, rng_state, unused,
        scale=scale)
    return dq, dk, dv


@functools.cache
def _no_dropout_state(device) -> torch.Tensor:
    # The philox seed/offset the flash backward takes; read only when dropout > 0, and ours is 0.
    return torch.zeros(2, dtype=torch.int64, device=device)


_LN2 = 0.6931471805599453


def lse_for_flash(lse_base2: torch.Tensor) -> torch.Tensor:
    """flashinfer's prefill LSE (base 2, [T, Hq]) as FlashAttention-2's varlen backward reads it (natural log,
    [Hq, T], contiguous fp32). Measured on the H200 (tests/gpu/test_flashinfer.py): within 1.7e-3 of FA2's own LSE
    (the two kernels' scores differ at bf16 level), gradients within 2.0-2.7e-3 (relative norm) of the re-run's."""
    return (lse_base2.float() * _LN2).t().contiguous()


_flash_backward_failed: list[str] = []  # the first error, once flash fell back to the efficient kernels


def configured_backward_kernel(dtype: torch.dtype) -> str:
    """The backward the plan (top.fast_paths.attention_backward) and dtype choose, before any failure here."""
    choice = str(_plan.current().fast_paths.attention_backward)
    return "efficient" if dtype not in (torch.bfloat16, torch.float16) else choice


def backward_kernel(dtype: torch.dtype) -> str:
    """The backward that runs: the configured one, or efficient once flash has failed in this process."""
    choice = configured_backward_kernel(dtype)
    return "efficient" if _flash_backward_failed else choice


def attention_backward(g, q, k, v, cu_seqlens, max_len, scale, out=None, lse=None):
    if backward_kernel(q.dtype) == "flash":
        try:
            grads = flash_attention_backward(g, q, k, v, cu_seqlens, max_len, scale, out, lse)
            _fallback.took("attention_backward", "flash")
            return grads
        except torch.OutOfMemoryError:
            raise
        except (RuntimeError, TypeError) as e:  # an op this torch build lacks or rejects: same gradients, slower
            _flash_backward_failed.append(f"{type(e).__name__}: {e}")
            _fallback.fell_back("attention_backward", _flash_backward_failed[0][:300])
            warnings.warn(f"flash attention backward failed ({_flash_backward_failed[0][:300]}); using the "
                          "memory-efficient kernels from now on", RuntimeWarning, stacklevel=2)
    _fallback.took("attention_backward", "efficient")
    return efficient_attention_backward(g, q, k, v, cu_seqlens, max_len, scale)
