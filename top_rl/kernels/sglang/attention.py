"""GPU varlen causal attention for the `sglang` kernel backend: the forward kernel the KernelPlan's attention names.

Forward = the engine's own attention kernel, called as SGLang 0.5.11 calls it in deterministic mode
(docs/numerics.md §5), chosen by a setting that must equal the engine's `--attention-backend` (top.attention_backend):
  triton      sglang.srt.layers.attention.triton_ops: the unified 1-stage extend kernel for prefill, the
              2-stage split-KV decode kernel with num_kv_splits = ceil(len / 256) for decode.
  flashinfer  attention_flashinfer.py: paged prefill and tensor-core paged decode, as the engine plans them.
  fa3         sgl_kernel's flash_attn_with_kvcache over a page-size-1 view, num_splits=1, as the engine.
Our K/V are contiguous per packed sequence, so the "cache" the kernels read is that tensor itself with
kv_indices = arange: the values and the kernel are the engine's, only the addresses differ.
Backward (all forward kernels): attention_backward.py. With activation recompute and top.fast_paths.recompute_attention,
the recompute inside the backward runs FlashAttention-2's forward instead (its LSE goes to the flash backward): the
gated forward is the engine's either way.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib

import torch

from top_rl.kernels import checkpoint_pass
from top_rl.kernels import fallback as _fallback
from top_rl.kernels import plan as _plan
from top_rl.kernels.packed_batch import PackedBatch, packed_batch
from top_rl.kernels.sglang import attention_backward as _backward
from top_rl.kernels.sglang import engine_env
from top_rl.kernels.sglang.attention_backward import configured_backward_kernel
from top_rl.kernels.sglang.attention_flashinfer import FlashinferState, decode_meta, token_indices  # noqa: F401

TRITON_DECODE_SPLIT = 256  # SGLANG_TRITON_DECODE_SPLIT_TILE_SIZE default (§1.3)


def set_attention_backend(name: str | None) -> None:
    """Compatibility for tests and benches: the installed plan with another attention kernel (None: none chosen)."""
    _plan.set_current(dataclasses.replace(_plan.current(), attention=name))


def attention_backend() -> str:
    """The installed plan's attention kernel: must equal the engines' --attention-backend."""
    name = _plan.current().attention
    if name is None:
        raise RuntimeError(
            f"no attention backend chosen: install a KernelPlan with attention= the engine's --attention-backend "
            f"(top.attention_backend; in a bench or test: {_plan.ATTENTION_ENV}, one of "
            f"{_plan.current().top.attention_backends})")
    return name


def _lengths(cu_seqlens: torch.Tensor) -> torch.Tensor:
    return cu_seqlens[1:] - cu_seqlens[:-1]


# ----------------------------------------------------------------------------------------- triton
@functools.cache
def _triton_ops():
    engine_env.pin_engine_env()
    release = engine_env.active_contract().release  # where this release keeps them (top_rl/sglang_release.py)
    ext = importlib.import_module(release.triton_extend_module)
    dec = importlib.import_module(release.triton_decode_module)
    return ext.extend_attention_fwd_unified, dec.decode_attention_fwd


def _triton_prefill(q, k, v, batch: PackedBatch, scale, want_lse):
    extend_unified, _ = _triton_ops()
    o = torch.empty_like(q)
    dev, t, bs = q.device, q.shape[0], len(batch.lengths)
    cu = batch.cu(torch.int64)
    extend_unified(
        q, o, k, v, 1.0, 1.0,  # k/v descale 1.0 as for an unquantised cache
        cu,  # qo_indptr
        cu,  # unified kv_indptr: no prefix, so the extend tokens themselves
        batch.derived(("kv_indices", t), lambda: torch.arange(t, dtype=torch.int64, device=dev)),
        batch.derived("prefix_lens", lambda: torch.zeros(bs, dtype=torch.int32, device=dev)),
        batch.max_len,
        sm_scale=scale, is_causal=True,
    )
    return o, None  # the kernel does not return its log-sum-exp


def decode_kv_indices(kv_indptr: torch.Tensor, b: int, max_len: int) -> torch.Tensor:
    """token_indices for a decode batch, without reading the lengths on the host: entry kv_indptr[r] + j is
    r * max_len + j for j < lengths[r]. Fixed size b * max_len; the kernel reads only entries below kv_indptr[b], so
    the tail is filler. (A host read per layer would stall the GPU queue, and a CUDA graph cannot hold one.)"""
    flat = torch.arange(b * max_len, device=kv_indptr.device)
    row = torch.searchsorted(kv_indptr[1:].long(), flat, right=True).clamp_(max=b - 1)
    return row * max_len + flat - kv_indptr[row]


def _triton_decode_meta(lengths: torch.Tensor, b: int, max_len: int):
    lengths = lengths.to(torch.int32)
    kv_indptr = torch.zeros(b + 1, dtype=torch.int32, device=lengths.device)
    kv_indptr[1:] = torch.cumsum(lengths, 0)
    num_kv_splits = ((lengths + TRITON_DECODE_SPLIT - 1) // TRITON_DECODE_SPLIT).to(torch.int32)
    return kv_indptr, decode_kv_indices(kv_indptr, b, max_len), num_kv_splits


def _triton_decode(q, k_cache, v_cache, lengths, scale):
    _, decode = _triton_ops()
    b, max_len = k_cache.shape[:2]
    kv_indptr, kv_indices, num_kv_splits = decode_meta.get(
        lengths, ("triton", b, max_len), lambda: _triton_decode_meta(lengths.to(q.device), b, max_len))
    # The engine sizes this by its context length; it is only a loop bound over (skipped) empty splits.
    max_kv_splits = max(1, -(-max_len // TRITON_DECODE_SPLIT))
    hq, dv = q.shape[1], v_cache.shape[-1]
    attn_logits = torch.empty((b, hq, max_kv_splits, dv), dtype=torch.float32, device=q.device)
    attn_lse = torch.empty((b, hq, max_kv_splits), dtype=torch.float32, device=q.device)
    o = torch.empty_like(q)
    decode(
        q.contiguous(), k_cache.reshape(b * max_len, *k_cache.shape[2:]), v_cache.reshape(b * max_len, *v_cache.shape[2:]),
        o, kv_indptr, kv_indices, attn_logits, attn_lse, num_kv_splits, max_kv_splits, scale, 1.0, 1.0,
    )
    return o


# ------------------------------------------------------------------------------------- flashinfer
def _flashinfer_prefill(q, k, v, batch: PackedBatch, scale, want_lse):
    return FlashinferState.get(q.device).run_prefill(q, k, v, batch, scale, want_lse)


def _flashinfer_decode(q, k_cache, v_cache, lengths, scale):
    return FlashinferState.get(q.device).run_decode(q, k_cache, v_cache, lengths, scale)


# -------------------------------------------------------------------------------------------- fa3
@functools.cache
def _fa3():
    try:
        return importlib.import_module("sgl_kernel.flash_attn").flash_attn_with_kvcache
    except ImportError as e:
        raise RuntimeError("attention backend 'fa3' needs sgl_kernel's FA3 build (sglang-kernel 0.4.2)") from e


def _fa3_prefill(q, k, v, batch: PackedBatch, scale, want_lse):
    cu_seqlens, max_len = batch.cu(torch.int64), batch.max_len
    lengths = _lengths(cu_seqlens)
    b, t = lengths.numel(), q.shape[0]
    # page table row b = the token indices of sequence b (page size 1), padded with index 0
    page_table = torch.zeros((b, max_len), dtype=torch.int32, device=q.device)
    col = torch.arange(t, device=q.device) - torch.repeat_interleave(cu_seqlens[:-1], lengths)
    page_table[torch.repeat_interleave(torch.arange(b, device=q.device), lengths), col] = torch.arange(
        t, dtype=torch.int32, device=q.device
    )
    cu32 = batch.cu(torch.int32)
    # return_softmax_lse only decides whether the LSE the kernel always computes is handed back (sgl_kernel's
    # flash_attn_with_kvcache makes the same `fwd` call either way): `out` keeps the engine's bits
    # (tests/gpu/test_fa3_trainer.py proves it)
    result = _fa3()(
        q=q.contiguous(), k_cache=k.unsqueeze(1), v_cache=v.unsqueeze(1), page_table=page_table,
        cache_seqlens=lengths.to(torch.int32), cu_seqlens_q=cu32, cu_seqlens_k_new=cu32, max_seqlen_q=max_len,
        softmax_scale=scale, causal=True, num_splits=1, return_softmax_lse=want_lse,
    )
    if want_lse:
        out, lse, *_ = result
        return out, lse  # varlen q: [Hq, T] fp32, natural log
    return result, None


def _fa3_decode(q, k_cache, v_cache, lengths, scale):
    b, max_len, hkv, d = k_cache.shape
    page_table = (torch.arange(b, device=q.device)[:, None] * max_len + torch.arange(max_len, device=q.device)).to(
        torch.int32
    )
    cu_q = torch.arange(b + 1, dtype=torch.int32, device=q.device)
    return _fa3()(
        q=q.contiguous(), k_cache=k_cache.reshape(b * max_len, 1, hkv, d), v_cache=v_cache.reshape(b * max_len, 1, hkv, d),
        page_table=page_table, cache_seqlens=lengths.to(torch.int32), cu_seqlens_q=cu_q, max_seqlen_q=1,
        softmax_scale=scale, causal=True, num_splits=1,
    )


_PREFILL = {"triton": _triton_prefill, "flashinfer": _flashinfer_prefill, "fa3": _fa3_prefill}
_DECODE = {"triton": _triton_decode, "flashinfer": _flashinfer_decode, "fa3": _fa3_decode}
BACKENDS = tuple(_PREFILL)  # the kernels this module calls; which of them a run may use is its contract's choice


# The forwards that return an LSE the flash backward can read, each with its fast-path switch and the conversion to
# FlashAttention-2's varlen layout ([Hq, T] fp32, natural log); the others' backward re-runs FA2's forward.
# flashinfer's converter is looked up at each call, so a test that wraps attention_backward.lse_for_flash sees it run.
_FORWARD_LSE = {
    "flashinfer": ("flashinfer_lse", lambda lse: _backward.lse_for_flash(lse)),  # base 2, [T, Hq]
    "fa3": ("fa3_lse", lambda lse: lse),  # already FA2's layout and units
}


def _keep_forward_lse(backend: str, q, k, v) -> bool:
    """Whether the forward should hand its LSE to the backward: only a forward that returns one (_FORWARD_LSE),
    only when a gradient will be taken, only when its switch is on, and only when the flash backward (whose LSE
    layout it is converted to) is the configured one. Decided from what a recomputed forward sees the same way (grad
    mode, inputs, plan, dtype), never from `attention_backward._flash_backward_failed`: activation recompute
    requires both forwards to save the same tensors, and a flash backward failing in between must not change that
    (attention_backward ignores out/lse when it falls back)."""
    if backend not in _FORWARD_LSE:
        return False
    switch, _ = _FORWARD_LSE[backend]
    return (torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
            and getattr(_plan.current().fast_paths, switch) and configured_backward_kernel(q.dtype) == "flash")


def _flash_in_recompute(q, k, v) -> bool:
    """Whether this forward is part of a checkpointed layer whose recompute runs FlashAttention-2's forward
    (top.fast_paths.recompute_attention): decided the same way in the layer's first pass and in its recompute (the pass
    aside), since both must save the same tensors, and only where the flash backward will read what it saves."""
    return (checkpoint_pass.current() is not None and _plan.current().fast_paths.recompute_attention
            and torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
            and configured_backward_kernel(q.dtype) == "flash")


def flash_forward(q, k, v, batch: PackedBatch, scale):
    """FlashAttention-2's varlen causal forward (aten, GQA native): (out, lse), the LSE in the layout its backward
    reads ([Hq, T] fp32, natural log). Only the recompute calls it: it is not the engine's kernel."""
    try:
        out, lse, *_ = _backward.flash_attention_forward(q, k, v, batch.cu(torch.int32), batch.max_len, scale)
    except torch.OutOfMemoryError:
        raise
    except (RuntimeError, TypeError) as e:
        raise RuntimeError(f"top.fast_paths.recompute_attention=true needs aten's FlashAttention-2 forward, which "
                           f"failed here ({type(e).__name__}: {str(e)[:200]}): set it false") from e
    return out, lse


class _VarlenCausalAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, cu_seqlens, scale, backend, keep_lse, flash_recompute):
        batch = packed_batch(cu_seqlens)
        if flash_recompute and checkpoint_pass.current() == checkpoint_pass.RECOMPUTE:
            # The backward's tensors only: the gated output came from the engine's kernel in the first pass.
            out, lse = flash_forward(q, k, v, batch, scale)
            _fallback.took("attention_recompute", "flash_varlen")
            ctx.save_for_backward(q, k, v, cu_seqlens, out, lse)
        else:
            out, lse = _PREFILL[backend](q, k, v, batch, scale, keep_lse)
            if keep_lse:
                ctx.save_for_backward(q, k, v, cu_seqlens, out, _FORWARD_LSE[backend][1](lse))
            elif flash_recompute:  # the first pass: its saved tensors are dropped, only their shapes must match
                lse_shape = torch.empty((q.shape[1], q.shape[0]), dtype=torch.float32, device=q.device)
                ctx.save_for_backward(q, k, v, cu_seqlens, out, lse_shape)
            else:
                ctx.save_for_backward(q, k, v, cu_seqlens)
        ctx.scale, ctx.max_len = scale, batch.max_len
        return out

    @staticmethod
    def backward(ctx, g):
        q, k, v, cu_seqlens, *forward_state = ctx.saved_tensors
        dq, dk, dv = _backward.attention_backward(g, q, k, v, cu_seqlens, ctx.max_len, ctx.scale, *forward_state)
        return dq, dk.to(k.dtype), dv.to(v.dtype), None, None, None, None, None


def attention(q, k, v, cu_seqlens, scale):
    backend = attention_backend()
    return _VarlenCausalAttention.apply(q, k, v, cu_seqlens, scale, backend, _keep_forward_lse(backend, q, k, v),
                                        _flash_in_recompute(q, k, v))


@torch.no_grad()
def decode_attention(q, k_cache, v_cache, lengths, scale):
    return _DECODE[attention_backend()](q, k_cache, v_cache, lengths, scale)
