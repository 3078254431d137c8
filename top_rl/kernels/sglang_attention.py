"""GPU varlen causal attention for the `sglang` kernel backend. (Named sglang_attention, not attention:
a submodule `kernels.attention` would replace the seam function of that name on import.)

Forward = the engine's own attention kernel, called as SGLang 0.5.11 calls it in deterministic mode
(docs/numerics.md §5), chosen by a setting that must equal the engine's `--attention-backend`:
  triton      sglang.srt.layers.attention.triton_ops: the unified 1-stage extend kernel for prefill, the
              2-stage split-KV decode kernel with num_kv_splits = ceil(len / 256) for decode.
  flashinfer  paged prefill (page size 1, fixed split 4096) and tensor-core paged decode (fixed split
              2048), both backend fa2, planned through the engine's deprecated begin_forward/forward calls
              with the same arguments; one shared 1 GiB workspace; one plan per batch (all layers reuse it).
              `FLASHINFER_PREFILL = "ragged"` switches prefill to the ragged wrapper (fa2), which the engine
              uses only outside deterministic mode.
  fa3         sgl_kernel's flash_attn_with_kvcache over a page-size-1 view, num_splits=1, as the engine.
Our K/V are contiguous per packed sequence, so the "cache" the kernels read is that tensor itself with
kv_indices = arange: the values and the kernel are the engine's, only the addresses differ.

Backward (all forward backends): aten's varlen fused attention kernels, called directly with cu_seqlens
and causal masking, so memory is O(L) (no dense mask, no L x L scores). The backward needs the forward's
log-sum-exp: flashinfer's forward returns it (base 2, [T, Hq]; converted by `lse_for_flash`), the other
forwards do not, so for them the flash kernel's own forward is re-run inside backward for it (no autograd
graph is recorded or differentiated there; $TOP_RL_FLASHINFER_LSE=0 forces the re-run for flashinfer too).
Gradients need to be right, not batch-invariant (only forward log-probs are compared bitwise), so the
fastest correct kernel is used: FlashAttention-2 (aten `_flash_attention_*`, GQA native) for bf16/fp16, else
memory-efficient attention (K/V heads repeated, their gradients summed).
$TOP_RL_ATTENTION_BACKWARD=efficient forces the latter (A/B measurements); a flash call that raises falls
back to it for the rest of the process, with a warning.
"""

from __future__ import annotations

import functools
import importlib
import os
import warnings

import torch

from top_rl.contract import DEFAULT
from top_rl.kernels.packed_batch import DecodeMeta, PackedBatch, packed_batch

ENV_VAR = "TOP_RL_ATTENTION_BACKEND"
BACKENDS = DEFAULT.attention_backends
TRITON_DECODE_SPLIT = 256  # SGLANG_TRITON_DECODE_SPLIT_TILE_SIZE default (§1.3)
FLASHINFER_PREFILL_SPLIT = 4096  # SGLANG_FLASHINFER_PREFILL_SPLIT_TILE_SIZE default
FLASHINFER_DECODE_SPLIT = 2048  # SGLANG_FLASHINFER_DECODE_SPLIT_TILE_SIZE default
FLASHINFER_WORKSPACE_BYTES = 1 << 30
FLASHINFER_PREFILL = "paged"  # the engine's deterministic-mode path (§5: ragged is off there)

_selected: str | None = None


def set_attention_backend(name: str | None) -> None:
    """Pin the attention kernel; must equal the engine's --attention-backend (None: back to the env var)."""
    global _selected
    if name is not None and name not in BACKENDS:
        raise ValueError(f"attention backend {name!r} is not in the TOP contract's {BACKENDS}")
    _selected = name


def attention_backend() -> str:
    name = _selected or os.environ.get(ENV_VAR)
    if name is None:
        raise RuntimeError(
            f"no attention backend chosen: call top_rl.kernels.sglang_attention.set_attention_backend(...) or set "
            f"{ENV_VAR} to the engine's --attention-backend (one of {BACKENDS})"
        )
    if name not in BACKENDS:
        raise ValueError(f"{ENV_VAR}={name!r} is not in the TOP contract's {BACKENDS}")
    return name


_decode_meta = DecodeMeta()


def _lengths(cu_seqlens: torch.Tensor) -> torch.Tensor:
    return cu_seqlens[1:] - cu_seqlens[:-1]


def _token_indices(lengths: torch.Tensor, row_stride: int) -> torch.Tensor:
    """Flat indices of the first lengths[b] tokens of row b in a [B, row_stride] layout."""
    starts = torch.repeat_interleave(torch.arange(len(lengths), device=lengths.device) * row_stride, lengths)
    offsets = torch.arange(int(lengths.sum()), device=lengths.device)
    cu = torch.cumsum(lengths, 0) - lengths
    return starts + offsets - torch.repeat_interleave(cu, lengths)


# ----------------------------------------------------------------------------------------- triton
@functools.cache
def _triton_ops():
    from top_rl.kernels.sglang import pin_engine_env

    pin_engine_env()
    ext = importlib.import_module("sglang.srt.layers.attention.triton_ops.extend_attention")
    dec = importlib.import_module("sglang.srt.layers.attention.triton_ops.decode_attention")
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
    """_token_indices for a decode batch, without reading the lengths on the host: entry kv_indptr[r] + j is
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
    kv_indptr, kv_indices, num_kv_splits = _decode_meta.get(
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
def kv_buffers(k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V as the engine hands them to flashinfer: two separate contiguous [tokens, Hkv, d] buffers (its
    MHATokenToKVPool.get_kv_buffer), which flashinfer views as page-size-1 pages. flashinfer reads both
    through ONE set of strides (it checks `paged_k_cache.stride(i) == paged_v_cache.stride(i)`), so a V that
    is a column slice of the fused qkv projection (row stride = the qkv width) must be made contiguous."""
    return k.contiguous(), v.contiguous()


class FlashinferState:
    """One 1 GiB fa2 workspace per process shared by every wrapper (as the engine's global workspace), and
    the plan of the batch in flight: a forward pass plans once, its layers reuse the plan."""

    _instance: "FlashinferState | None" = None

    def __init__(self, fi, device):
        self.fi = fi
        self.workspace = torch.empty(FLASHINFER_WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        if FLASHINFER_PREFILL == "ragged":
            self.prefill = fi.BatchPrefillWithRaggedKVCacheWrapper(self.workspace, "NHD", backend="fa2")
        else:
            self.prefill = fi.BatchPrefillWithPagedKVCacheWrapper(self.workspace, "NHD", backend="fa2")
        self.decode = fi.BatchDecodeWithPagedKVCacheWrapper(
            self.workspace, "NHD", use_tensor_cores=True, backend="fa2"
        )
        self.plans = {"prefill": None, "decode": None}
        self.plan_count = {"prefill": 0, "decode": 0}
        self._keep = {}  # index tensors a plan may still read

    @classmethod
    def get(cls, device) -> "FlashinferState":
        if cls._instance is None:
            try:
                fi = importlib.import_module("flashinfer")
            except ImportError as e:
                raise RuntimeError("attention backend 'flashinfer' needs the flashinfer package (0.6.8.post1, what sglang 0.5.11 pins)") from e
            cls._instance = cls(fi, device)
        return cls._instance

    @classmethod
    def reset(cls) -> None:
        cls._instance = None

    def _needs_plan(self, kind: str, key) -> bool:
        if self.plans[kind] == key:
            return False
        self.plans[kind] = key
        self.plan_count[kind] += 1
        return True

    def run_prefill(self, q, k, v, batch: PackedBatch, scale, want_lse=False):
        """(out, lse or None). `want_lse`: also the kernel's base-2 log-sum-exp [T, Hq] (forward_return_lse: the
        engine's forward with the same arguments, whose output is the same; tests/gpu/test_flashinfer.py)."""
        hq, hkv, d = q.shape[1], k.shape[1], q.shape[2]
        cu = batch.cu(torch.int32)
        key = (batch.bounds, hq, hkv, d, q.dtype, k.dtype)
        if FLASHINFER_PREFILL == "ragged":
            if self._needs_plan("prefill", key):
                self._keep["prefill"] = cu
                self.prefill.begin_forward(cu, cu, hq, hkv, d, q_data_type=q.dtype, fixed_split_size=FLASHINFER_PREFILL_SPLIT)
            return self._prefill_forward(want_lse, q.contiguous(), k, v, causal=True, sm_scale=scale,
                                         logits_soft_cap=0.0)
        if self._needs_plan("prefill", key):
            indices = torch.arange(q.shape[0], dtype=torch.int32, device=q.device)
            last = torch.ones(cu.numel() - 1, dtype=torch.int32, device=q.device)
            self._keep["prefill"] = (cu, indices, last)
            self.prefill.begin_forward(  # engine: call_begin_forward, paged part (page size 1)
                cu, cu, indices, last, hq, hkv, d, 1, q_data_type=q.dtype, kv_data_type=k.dtype,
                custom_mask=None, non_blocking=True, fixed_split_size=FLASHINFER_PREFILL_SPLIT,
            )
        return self._prefill_forward(
            want_lse, q.contiguous(), kv_buffers(k, v), causal=True, sm_scale=scale, window_left=-1,
            logits_soft_cap=0.0, k_scale=None, v_scale=None,
        )

    def _prefill_forward(self, want_lse, *args, **kwargs):
        if want_lse:
            return self.prefill.forward_return_lse(*args, **kwargs)
        return self.prefill.forward(*args, **kwargs), None

    def run_decode(self, q, k_cache, v_cache, lengths, scale):
        b, max_len, hkv, d = k_cache.shape
        host = _decode_meta.get(lengths, "host", lambda: tuple(lengths.tolist()))  # one read per forward, not per layer
        lengths = lengths.to(torch.int32)
        key = (host, max_len, q.shape[1], hkv, d, q.dtype, k_cache.dtype)
        if self._needs_plan("decode", key):
            indptr = torch.zeros(b + 1, dtype=torch.int32, device=q.device)
            indptr[1:] = torch.cumsum(lengths, 0)
            indices = _token_indices(lengths.long(), max_len).to(torch.int32)
            last = torch.ones(b, dtype=torch.int32, device=q.device)
            self._keep["decode"] = (indptr, indices, last)
            self.decode.begin_forward(
                indptr, indices, last, q.shape[1], hkv, d, 1, data_type=k_cache.dtype, q_data_type=q.dtype,
                non_blocking=True, fixed_split_size=FLASHINFER_DECODE_SPLIT, disable_split_kv=False,
            )
        kv = kv_buffers(k_cache.reshape(b * max_len, hkv, d), v_cache.reshape(b * max_len, hkv, d))
        return self.decode.forward(q.contiguous(), kv, sm_scale=scale, logits_soft_cap=0.0, k_scale=None, v_scale=None)


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
    return _fa3()(
        q=q.contiguous(), k_cache=k.unsqueeze(1), v_cache=v.unsqueeze(1), page_table=page_table,
        cache_seqlens=lengths.to(torch.int32), cu_seqlens_q=cu32, cu_seqlens_k_new=cu32, max_seqlen_q=max_len,
        softmax_scale=scale, causal=True, num_splits=1,
    ), None


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


# ------------------------------------------------------------------------------------- backward
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


def flash_attention_backward(g, q, k, v, cu_seqlens, max_len, scale, out=None, lse=None):
    """(dq, dk, dv) of causal varlen attention through aten's FlashAttention-2 kernels (bf16/fp16, GQA native).
    `out` and `lse` (natural log, [Hq, T] fp32: `lse_for_flash`) from the forward that ran skip the re-run."""
    cu = packed_batch(cu_seqlens).cu(torch.int32)
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    if lse is None:
        out, lse, rng_state, unused, _ = torch.ops.aten._flash_attention_forward(
            q, k, v, cu, cu, max_len, max_len, 0.0, True, False, scale=scale)
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


LSE_ENV = "TOP_RL_FLASHINFER_LSE"  # "0": re-run the flash forward in backward even after flashinfer
_LN2 = 0.6931471805599453


def lse_for_flash(lse_base2: torch.Tensor) -> torch.Tensor:
    """flashinfer's prefill LSE (base 2, [T, Hq]) as FlashAttention-2's varlen backward reads it (natural log,
    [Hq, T], contiguous fp32). Measured on the H200 (tests/gpu/test_flashinfer.py): within 1.7e-3 of FA2's own LSE
    (the two kernels' scores differ at bf16 level), gradients within 2.0-2.7e-3 (relative norm) of the re-run's."""
    return (lse_base2.float() * _LN2).t().contiguous()


BACKWARD_ENV = "TOP_RL_ATTENTION_BACKWARD"
_flash_backward_failed: list[str] = []  # the first error, once flash fell back to the efficient kernels


def configured_backward_kernel(dtype: torch.dtype) -> str:
    """The backward the env and dtype choose, before any failure in this process."""
    choice = os.environ.get(BACKWARD_ENV, "flash")
    if choice not in ("flash", "efficient"):
        raise ValueError(f"{BACKWARD_ENV}={choice!r}; choose 'flash' or 'efficient'")
    return "efficient" if dtype not in (torch.bfloat16, torch.float16) else choice


def backward_kernel(dtype: torch.dtype) -> str:
    """The backward that runs: the configured one, or efficient once flash has failed in this process."""
    choice = configured_backward_kernel(dtype)
    return "efficient" if _flash_backward_failed else choice


def attention_backward(g, q, k, v, cu_seqlens, max_len, scale, out=None, lse=None):
    if backward_kernel(q.dtype) == "flash":
        try:
            return flash_attention_backward(g, q, k, v, cu_seqlens, max_len, scale, out, lse)
        except torch.OutOfMemoryError:
            raise
        except (RuntimeError, TypeError) as e:  # an op this torch build lacks or rejects: same gradients, slower
            _flash_backward_failed.append(f"{type(e).__name__}: {e}")
            warnings.warn(f"flash attention backward failed ({_flash_backward_failed[0][:300]}); using the "
                          "memory-efficient kernels from now on", RuntimeWarning, stacklevel=2)
    return efficient_attention_backward(g, q, k, v, cu_seqlens, max_len, scale)


def _keep_forward_lse(backend: str, q, k, v) -> bool:
    """Whether the forward should hand its LSE to the backward: only a forward that returns one (flashinfer),
    only when a gradient will be taken, and only when the flash backward (whose LSE layout it is converted to) is
    the configured one. Decided from what a recomputed forward sees the same way (grad mode, inputs, env, dtype),
    never from `_flash_backward_failed`: activation recompute requires both forwards to save the same tensors,
    and a flash backward failing in between must not change that (attention_backward ignores out/lse when it
    falls back)."""
    return (backend == "flashinfer" and torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
            and os.environ.get(LSE_ENV, "1") != "0" and configured_backward_kernel(q.dtype) == "flash")


class _VarlenCausalAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, cu_seqlens, scale, backend, keep_lse):
        batch = packed_batch(cu_seqlens)
        out, lse = _PREFILL[backend](q, k, v, batch, scale, keep_lse)
        if keep_lse:
            ctx.save_for_backward(q, k, v, cu_seqlens, out, lse_for_flash(lse))
        else:
            ctx.save_for_backward(q, k, v, cu_seqlens)
        ctx.scale, ctx.max_len = scale, batch.max_len
        return out

    @staticmethod
    def backward(ctx, g):
        q, k, v, cu_seqlens, *forward_state = ctx.saved_tensors
        dq, dk, dv = attention_backward(g, q, k, v, cu_seqlens, ctx.max_len, ctx.scale, *forward_state)
        return dq, dk.to(k.dtype), dv.to(v.dtype), None, None, None, None


def attention(q, k, v, cu_seqlens, scale):
    backend = attention_backend()
    return _VarlenCausalAttention.apply(q, k, v, cu_seqlens, scale, backend, _keep_forward_lse(backend, q, k, v))


@torch.no_grad()
def decode_attention(q, k_cache, v_cache, lengths, scale):
    return _DECODE[attention_backend()](q, k_cache, v_cache, lengths, scale)
