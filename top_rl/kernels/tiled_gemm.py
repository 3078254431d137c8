"""Fixed-shape GEMM: the reference backend's batch- and TP-invariant matrix product.

Measured on this project's CPUs (docs/architecture.md): a row of `x @ W` changes with the number of rows M below 16,
a K above 512 is reduced differently with 1 and 2 threads, and a column can change with N. So rows are
padded to a multiple of `row_tile`, columns are produced `col_tile` at a time, and K is cut into
`k_chunk` slices whose fp32 partial products are summed left to right in global chunk order. Every call
therefore sees the same shapes whatever the batch, and a row-parallel linear that gathers the partials of
all ranks before summing gives the TP=1 bits at any TP degree.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from top_rl.contract import GemmTiling
from top_rl.kernels import plan as _plan


def contract_tiling() -> GemmTiling:
    """The shapes of the installed KernelPlan's contract (the run's top.contract): engine and trainer tile alike."""
    return _plan.current().top.tiling


def acc_dtype(dtype: torch.dtype) -> torch.dtype:
    """fp32 accumulation (bf16 inputs, fp32 accumulator, one final rounding); fp64 stays fp64 for gradcheck."""
    return torch.promote_types(dtype, torch.float32)


def pad_to(t: torch.Tensor, dim: int, multiple: int) -> torch.Tensor:
    size = t.shape[dim]
    extra = (-size) % multiple
    if extra == 0:
        return t
    pad_shape = list(t.shape)
    pad_shape[dim] = extra
    return torch.cat([t, t.new_zeros(pad_shape)], dim=dim)


def k_partials(x2d: torch.Tensor, w: torch.Tensor, tiling: GemmTiling) -> torch.Tensor:
    """[C, M, N] partial products of x2d[M, K] @ w[N, K].T over K-chunks, in the accumulation dtype."""
    acc = acc_dtype(torch.promote_types(x2d.dtype, w.dtype))
    m, n = x2d.shape[0], w.shape[0]
    a = pad_to(pad_to(x2d.to(acc), 0, tiling.row_tile), 1, tiling.k_chunk)
    b = pad_to(pad_to(w.to(acc), 0, tiling.col_tile), 1, tiling.k_chunk)
    kc, ct = tiling.k_chunk, tiling.col_tile
    n_chunks = a.shape[1] // kc
    out = a.new_empty((n_chunks, a.shape[0], b.shape[0]))
    for c in range(n_chunks):
        a_c = a[:, c * kc : (c + 1) * kc]
        for j in range(0, b.shape[0], ct):
            out[c, :, j : j + ct] = a_c @ b[j : j + ct, c * kc : (c + 1) * kc].T
    return out[:, :m, :n]


def fold(partials: torch.Tensor) -> torch.Tensor:
    """Sum partials over dim 0 strictly left to right (a fixed order, independent of how they were made)."""
    total = partials[0].clone()
    for c in range(1, partials.shape[0]):
        total += partials[c]
    return total


def gather_partials(partials: torch.Tensor, group) -> torch.Tensor:
    """Concatenate the K-chunk partials of every rank of `group` in rank order (= global K order)."""
    if group is None or dist.get_world_size(group) == 1:
        return partials
    parts = [torch.empty_like(partials) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, partials.contiguous(), group=group)
    return torch.cat(parts, dim=0)


def matmul_nt(x2d: torch.Tensor, w: torch.Tensor, group=None, tiling: GemmTiling | None = None) -> torch.Tensor:
    """x2d @ w.T in the accumulation dtype, TP-invariant when `group` splits K (`tiling` None: the installed plan's)."""
    tiling = tiling or contract_tiling()
    if group is not None and dist.get_world_size(group) > 1 and x2d.shape[1] % tiling.k_chunk:
        raise ValueError(
            f"row-parallel K shard of {x2d.shape[1]} is not a multiple of the contract's k_chunk "
            f"{tiling.k_chunk}: choose a TP degree that divides the layer width into {tiling.k_chunk}-wide chunks"
        )
    return fold(gather_partials(k_partials(x2d, w, tiling), group))
