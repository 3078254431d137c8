"""flashinfer attention for the `sglang` backend (attention.py chooses it): the engine's deterministic-mode calls.

Paged prefill (page size 1, fixed split 4096) and tensor-core paged decode (fixed split 2048), both backend fa2,
planned through the engine's deprecated begin_forward/forward calls with the same arguments; one shared 1 GiB
workspace; one plan per batch (all layers reuse it). `FLASHINFER_PREFILL = "ragged"` switches prefill to the ragged
wrapper (fa2), which the engine uses only outside deterministic mode.
"""

from __future__ import annotations

import importlib

import torch

from top_rl.kernels.packed_batch import DecodeMeta, PackedBatch

FLASHINFER_PREFILL_SPLIT = 4096  # SGLANG_FLASHINFER_PREFILL_SPLIT_TILE_SIZE default
FLASHINFER_DECODE_SPLIT = 2048  # SGLANG_FLASHINFER_DECODE_SPLIT_TILE_SIZE default
FLASHINFER_WORKSPACE_BYTES = 1 << 30
FLASHINFER_PREFILL = "paged"  # the engine's deterministic-mode path (§5: ragged is off there)

decode_meta = DecodeMeta()  # a decode batch's lengths read on the host once per forward (shared with triton decode)


def token_indices(lengths: torch.Tensor, row_stride: int) -> torch.Tensor:
    """Flat indices of the first lengths[b] tokens of row b in a [B, row_stride] layout."""
    starts = torch.repeat_interleave(torch.arange(len(lengths), device=lengths.device) * row_stride, lengths)
    offsets = torch.arange(int(lengths.sum()), device=lengths.device)
    cu = torch.cumsum(lengths, 0) - lengths
    return starts + offsets - torch.repeat_interleave(cu, lengths)


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
        host = decode_meta.get(lengths, "host", lambda: tuple(lengths.tolist()))  # one read per forward, not per layer
        lengths = lengths.to(torch.int32)
        key = (host, max_len, q.shape[1], hkv, d, q.dtype, k_cache.dtype)
        if self._needs_plan("decode", key):
            indptr = torch.zeros(b + 1, dtype=torch.int32, device=q.device)
            indptr[1:] = torch.cumsum(lengths, 0)
            indices = token_indices(lengths.long(), max_len).to(torch.int32)
            last = torch.ones(b, dtype=torch.int32, device=q.device)
            self._keep["decode"] = (indptr, indices, last)
            self.decode.begin_forward(
                indptr, indices, last, q.shape[1], hkv, d, 1, data_type=k_cache.dtype, q_data_type=q.dtype,
                non_blocking=True, fixed_split_size=FLASHINFER_DECODE_SPLIT, disable_split_kv=False,
            )
        kv = kv_buffers(k_cache.reshape(b * max_len, hkv, d), v_cache.reshape(b * max_len, hkv, d))
        return self.decode.forward(q.contiguous(), kv, sm_scale=scale, logits_soft_cap=0.0, k_scale=None, v_scale=None)

