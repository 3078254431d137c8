"""Host facts of a packed batch (its sequence bounds, longest length, index tensors derived from cu_seqlens), read
once per cu_seqlens tensor instead of once per attention call.

Every layer of a forward (and the recomputed forward of activation checkpointing) receives the same cu_seqlens
tensor. Reading its values on the host is a device-to-host copy that waits for the GPU to drain: the launch queue
empties and the GPU idles until the host has launched the next kernels. Done per layer, that is 2 stalls x layers x
(forward + recompute) per micro-batch (bench/RESULTS.md, "GPU idle"). Here the first call pays the one read and
later calls with the same tensor (same object, same in-place version) reuse it.

The cache holds the tensor weakly (a freed batch leaves it) and only its last few batches (pipeline schedules
interleave a few micro-batches); derived tensors are kept only while their batch is cached. `DecodeMeta` does the
same for a decode step's lengths tensor (one per forward, shared by every layer).
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from typing import Callable

import torch

_CAPACITY = 8  # micro-batches in flight at once under a pipeline schedule, with room to spare


class PackedBatch:
    """The host view of one cu_seqlens tensor: `bounds` (cu_seqlens as ints), `max_len`, and device tensors
    derived from it, each built once (`derived`)."""

    def __init__(self, cu_seqlens: torch.Tensor, bounds: tuple[int, ...]):
        self._source = weakref.ref(cu_seqlens)
        self._version = None if cu_seqlens.is_inference() else cu_seqlens._version  # inference: never cached
        self.bounds = bounds
        self.lengths = tuple(e - s for s, e in zip(bounds[:-1], bounds[1:]))
        self.max_len = max(self.lengths, default=0)
        self.num_tokens = bounds[-1] if bounds else 0
        self._derived: dict = {}

    def describes(self, cu_seqlens: torch.Tensor) -> bool:
        return self._source() is cu_seqlens and self._version == cu_seqlens._version

    def cu(self, dtype: torch.dtype) -> torch.Tensor:
        """cu_seqlens in `dtype` (the tensor itself when it already has it)."""
        source = self._source()
        if source is None:
            raise RuntimeError("the cu_seqlens tensor of this packed batch was freed")
        if source.dtype == dtype:
            return source
        return self.derived(("cu", dtype), lambda: source.to(dtype))

    def derived(self, key, build: Callable[[], torch.Tensor]) -> torch.Tensor:
        """A tensor that depends only on this batch (and `key`), built on first use."""
        t = self._derived.get(key)
        if t is None:
            t = self._derived[key] = build()
        return t


_cache: "OrderedDict[int, PackedBatch]" = OrderedDict()
host_reads = 0  # PackedBatch objects built, i.e. device-to-host reads of cu_seqlens (tests count them)


def packed_batch(cu_seqlens: torch.Tensor) -> PackedBatch:
    """The PackedBatch of `cu_seqlens`, read from the device only the first time this tensor is seen. Inference
    tensors have no version counter to see an in-place write by, so they are read every time."""
    global host_reads
    cacheable = not cu_seqlens.is_inference()
    key = id(cu_seqlens)
    batch = _cache.get(key) if cacheable else None
    if batch is not None and batch.describes(cu_seqlens):
        _cache.move_to_end(key)
        return batch
    host_reads += 1
    batch = PackedBatch(cu_seqlens, tuple(int(b) for b in cu_seqlens.tolist()))
    if cacheable:
        _cache[key] = batch
        _cache.move_to_end(key)
        while len(_cache) > _CAPACITY:
            _cache.popitem(last=False)
    return batch


class DecodeMeta:
    """What a decode step's kernels derive from its lengths tensor (kv indptr and indices, split counts, the host
    copy flashinfer plans with), built once for all layers: every layer of a forward gets the same tensor
    (Qwen3.forward's kv_lens). Held weakly with its version, so a freed or rewritten tensor never matches; inference
    tensors (no version counter) are derived anew each call."""

    def __init__(self):
        self._source, self._version, self._items = None, None, {}

    def get(self, lengths: torch.Tensor, key, build):
        if lengths.is_inference():
            return build()
        if self._source is None or self._source() is not lengths or self._version != lengths._version:
            self._source, self._version, self._items = weakref.ref(lengths), lengths._version, {}
        if key not in self._items:
            self._items[key] = build()
        return self._items[key]
