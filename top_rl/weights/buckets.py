"""Weights in buckets: consecutive named tensors grouped up to a byte budget, each sent as one flat uint8 buffer
(SGLang's FlattenedTensorBucket layout) with the metadata (names, dtypes, shapes) the receiver rebuilds them from.
Every transport and the SGLang requests use these, so both ends of a push walk the same order."""

from __future__ import annotations

import math
from typing import Iterable

import torch

Bucket = list[tuple[str, torch.Tensor]]


def dtype_name(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")  # SGLang does getattr(torch, name)


def buckets(named: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int) -> list[Bucket]:
    """Consecutive groups of at most `bucket_bytes` (a larger tensor travels alone). Within a bucket, tensors
    are ordered by element size, largest first (stable): in a flattened bucket every tensor then starts at a
    byte offset its dtype can be viewed from (SGLang's FlattenedTensorBucket fails on an fp32 tensor after an
    odd-length bf16 one). The metadata sent carries this order, which both sides of a broadcast walk."""
    from top_rl.model.hf_io import group_by_bytes

    return [sorted(b, key=lambda nt: -nt[1].element_size()) for b in group_by_bytes(named, bucket_bytes)]


def bucket_meta(bucket: Bucket) -> dict:
    return {"names": [n for n, _ in bucket], "dtypes": [dtype_name(t) for _, t in bucket],
            "shapes": [list(t.shape) for _, t in bucket]}


def meta_bytes(meta: dict) -> int:
    """The size of the flat buffer `meta` describes (what a receiver allocates)."""
    return sum(getattr(torch, d).itemsize * math.prod(s) for d, s in zip(meta["dtypes"], meta["shapes"]))


def flatten(bucket: Bucket) -> torch.Tensor:
    """One uint8 buffer: each tensor's bytes in order (SGLang's FlattenedTensorBucket layout)."""
    return torch.cat([t.detach().contiguous().reshape(-1).view(torch.uint8) for _, t in bucket])


def unflatten(flat: torch.Tensor, meta: dict) -> Bucket:
    dtypes = [getattr(torch, d) for d in meta["dtypes"]]
    sizes = [d.itemsize * math.prod(s) for d, s in zip(dtypes, meta["shapes"])]
    if sum(sizes) != flat.numel():
        raise ValueError(f"flattened bucket holds {flat.numel()} bytes, its metadata describes {sum(sizes)}")
    out, start = [], 0
    for name, dtype, shape, n in zip(meta["names"], dtypes, meta["shapes"], sizes):
        out.append((name, flat[start:start + n].view(dtype).reshape(shape)))
        start += n
    return out
