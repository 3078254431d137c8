"""Stock backend: the non-TOP baseline's kernels as a verl/slime user trains with them (`top.enabled=false`).

On CUDA the trainer's heavy ops take the fast stock kernels (bench/_stock_gpt.py's choices, inside the seam):
  attention       one varlen FlashAttention-2 call per layer over the packed THD batch (aten's
                  `_flash_attention_forward/backward` with cu_seqlens, causal, GQA native; bf16/fp16)
  rms_norm        Liger-Kernel's Triton RMSNorm (`LigerRMSNormFunction`, Llama casting) when `liger_kernel` imports
  token log-probs chunked over rows (CHUNK_ROWS a chunk) with an analytic backward that recomputes the softmax per
                  chunk, so no [T, V] fp32 log-softmax is kept for backward (only the logits, in their own dtype)
Everything else is `plain`'s (cuBLAS GEMMs through F.linear, torch RoPE and SiLU-and-mul, the engine's decode
attention and sampler distribution). On CPU, or where a fast path cannot run (fp32 attention, an input it does not
take), each op is `plain`'s own: the CPU baseline's numbers are plain's, bit for bit. A fast path that raises falls
back to plain's op for the rest of the process, with one warning (kernels.report() counts it); `report()["paths"]`
says which path each op took. The dtype policy is plain's (its docstring); results depend on batch shape, so
trainer and engine disagree: this is the baseline TOP is measured against, not a TOP backend.
"""

from __future__ import annotations

import warnings

import torch

from top_rl.kernels import fallback as _fallback
from top_rl.kernels import plain
from top_rl.kernels.packed_batch import packed_batch

CHUNK_ROWS = 1024  # rows per log-softmax chunk: bounds the fp32 [rows, V] temporaries (0.6 GB at V = 151936)

linear = plain.linear
row_linear = plain.row_linear
rope = plain.rope
silu_and_mul = plain.silu_and_mul
decode_attention = plain.decode_attention
sampler_log_softmax = plain.sampler_log_softmax

_failed: dict[str, str] = {}  # op -> the first error of its fast path (then plain's op runs for good)


def _fast(op: str, path: str, fast, slow_path: str, slow, *args):
    """`fast(*args)` recorded as `path`, or plain's `slow(*args)` (recorded as `slow_path`) once `fast` has raised
    in this process. Out-of-memory is raised: plain's op needs more memory, not less."""
    if op not in _failed:
        try:
            out = fast(*args)
            _fallback.took(op, path)
            return out
        except torch.OutOfMemoryError:
            raise
        except Exception as e:  # noqa: BLE001 - a launch/compile/shape failure: plain's op computes the same thing
            _failed[op] = _fallback.error_line(e)
            _fallback.fell_back(op, _failed[op])
            warnings.warn(f"stock {op} ({path}) failed ({_failed[op]}); plain's {slow_path} runs from now on",
                          RuntimeWarning, stacklevel=3)
    _fallback.took(op, slow_path)
    return slow(*args)


# ------------------------------------------------------------------------------------------------ attention
FLASH_DTYPES = (torch.bfloat16, torch.float16)


class _FlashVarlen(torch.autograd.Function):
    """Causal varlen attention over the packed batch, q [T, Hq, d], k/v [T, Hkv, d] (GQA native): one
    FlashAttention-2 forward and one backward (it reuses the forward's log-sum-exp; no dropout)."""

    @staticmethod
    def forward(ctx, q, k, v, cu, max_len, scale):
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        out, lse, rng, unused, _ = torch.ops.aten._flash_attention_forward(
            q, k, v, cu, cu, max_len, max_len, 0.0, True, False, scale=scale)
        ctx.save_for_backward(q, k, v, out, lse, cu, rng, unused)
        ctx.max_len, ctx.scale = max_len, scale
        return out

    @staticmethod
    def backward(ctx, g):
        q, k, v, out, lse, cu, rng, unused = ctx.saved_tensors
        dq, dk, dv = torch.ops.aten._flash_attention_backward(
            g.contiguous(), q, k, v, out, lse, cu, cu, ctx.max_len, ctx.max_len, 0.0, True, rng, unused,
            scale=ctx.scale)
        return dq, dk, dv, None, None, None


def flash_attention(q, k, v, cu_seqlens, scale):
    """The varlen flash path (CUDA, bf16/fp16): cu_seqlens and the longest length read on the host once per batch."""
    batch = packed_batch(cu_seqlens)
    return _FlashVarlen.apply(q, k, v, batch.cu(torch.int32), batch.max_len, scale)


def attention(q, k, v, cu_seqlens, scale):
    if q.is_cuda and q.dtype in FLASH_DTYPES and k.dtype == q.dtype == v.dtype:
        return _fast("attention", "flash_varlen", flash_attention, "sdpa_per_sequence", plain.attention,
                     q, k, v, cu_seqlens, scale)
    _fallback.took("attention", "sdpa_per_sequence")
    return plain.attention(q, k, v, cu_seqlens, scale)


# ------------------------------------------------------------------------------------------------ RMSNorm
_liger: dict = {}  # "fn": LigerRMSNormFunction, or "error": why liger_kernel did not import (looked up once)


def liger_rms_norm_function():
    """Liger-Kernel's RMSNorm autograd function, or None (the import error is kept in `_liger["error"]`)."""
    if not _liger:
        try:
            from liger_kernel.ops.rms_norm import LigerRMSNormFunction
            _liger["fn"] = LigerRMSNormFunction
        except Exception as e:  # noqa: BLE001 - any import failure: plain's torch RMSNorm runs
            _liger["fn"], _liger["error"] = None, _fallback.error_line(e)
    return _liger["fn"]


def _liger_norm(x, w, eps, out_dtype, result_dtype):
    """Liger with Llama casting: n = x * rstd in fp32, rounded to x.dtype, times w; written in x.dtype, then in the
    dtype plain returns (result_dtype, else w * n's promoted dtype)."""
    want = result_dtype or torch.promote_types(w.dtype, out_dtype or x.dtype)
    y = liger_rms_norm_function().apply(x.contiguous(), w, eps, 0.0, "llama", False)
    return y if y.dtype == want else y.to(want)


def _torch_norm(x, w, eps, out_dtype, result_dtype):
    return plain.rms_norm(x, w, eps, None, out_dtype, result_dtype)


def rms_norm(x, w, eps, residual=None, out_dtype=None, result_dtype=None):
    # Liger's "llama" casting rounds n to x.dtype: plain's policy whenever out_dtype is x's (both trainer norms)
    if (x.is_cuda and residual is None and (out_dtype or x.dtype) == x.dtype and x.shape[-1] == w.numel()
            and liger_rms_norm_function() is not None):
        return _fast("rms_norm", "liger", _liger_norm, "torch", _torch_norm, x, w, eps, out_dtype, result_dtype)
    _fallback.took("rms_norm", "torch")
    return plain.rms_norm(x, w, eps, residual, out_dtype, result_dtype)


# ------------------------------------------------------------------------------------------------ token log-probs
def _row_temperature(temperature, lo, hi):
    """The divisor of rows [lo, hi) as plain applies it: a per-row tensor as a column, a scalar as it is."""
    if torch.is_tensor(temperature) and temperature.numel() > 1:
        return temperature.reshape(-1, 1)[lo:hi]
    return temperature.reshape(-1, 1) if torch.is_tensor(temperature) else temperature


class _ChunkedTokenLogprobs(torch.autograd.Function):
    """plain's prefill_logprobs (temperature None: fp32 log_softmax(f32(L))[ids]) or sample_logprobs
    (log_softmax(f32(L) / t) rounded to L's dtype, [ids]), `chunk` rows at a time. Backward, per chunk again:
    d logits = (onehot(ids) - softmax) * g (/ t on the sampler path), in the logits' dtype; only the logits (their
    own dtype) and the ids are kept between forward and backward, never a [T, V] fp32 tensor."""

    @staticmethod
    def forward(ctx, logits, ids, temperature, chunk):
        out_dtype = torch.float32 if temperature is None else logits.dtype
        out = torch.empty(logits.shape[0], dtype=out_dtype, device=logits.device)
        for lo in range(0, logits.shape[0], chunk):
            hi = min(lo + chunk, logits.shape[0])
            lp = _chunk_log_softmax(logits[lo:hi], temperature, lo, hi)
            out[lo:hi] = lp.gather(-1, ids[lo:hi].unsqueeze(-1)).squeeze(-1).to(out_dtype)
        ctx.save_for_backward(logits, ids)
        ctx.temperature, ctx.chunk = temperature, chunk
        return out

    @staticmethod
    def backward(ctx, g):
        logits, ids = ctx.saved_tensors
        t, chunk = ctx.temperature, ctx.chunk
        grad = torch.empty_like(logits)
        for lo in range(0, logits.shape[0], chunk):
            hi = min(lo + chunk, logits.shape[0])
            lp = _chunk_log_softmax(logits[lo:hi], t, lo, hi)
            gc = g[lo:hi].to(lp.dtype).unsqueeze(-1)
            gl = -lp.exp_() * gc  # the log-softmax backward: onehot * g - softmax * g
            gl.scatter_add_(-1, ids[lo:hi].unsqueeze(-1), gc)
            if t is not None:
                gl = gl / _row_temperature(t, lo, hi)
            grad[lo:hi] = gl
        return grad, None, None, None


def _chunk_log_softmax(rows, temperature, lo, hi):
    z = rows.float()
    if temperature is not None:
        z = z / _row_temperature(temperature, lo, hi)
    return torch.log_softmax(z, -1)


def chunked_prefill_logprobs(logits, ids, chunk: int = CHUNK_ROWS):
    return _ChunkedTokenLogprobs.apply(logits, ids, None, chunk)


def chunked_sample_logprobs(logits, ids, temperature, chunk: int = CHUNK_ROWS):
    return _ChunkedTokenLogprobs.apply(logits, ids, temperature, chunk)


def prefill_logprobs(logits, ids):
    if logits.is_cuda:
        return _fast("prefill_logprobs", "chunked", chunked_prefill_logprobs, "torch", plain.prefill_logprobs,
                     logits, ids)
    _fallback.took("prefill_logprobs", "torch")
    return plain.prefill_logprobs(logits, ids)


def sample_logprobs(logits, ids, temperature):
    if logits.is_cuda:
        return _fast("sample_logprobs", "chunked", chunked_sample_logprobs, "torch", plain.sample_logprobs,
                     logits, ids, temperature)
    _fallback.took("sample_logprobs", "torch")
    return plain.sample_logprobs(logits, ids, temperature)
