"""Ulysses context parallelism: attention runs the same seam kernel on whole sequences.

With CP = c, each CP rank holds 2 of 2c chunks of every (padded) packed sequence (top_rl.train.batch
`cp_positions`, the load-balanced layout Megatron's THD RoPE applies positions for). Everything but
attention is per token, so it runs on the local tokens unchanged. At the core attention, one
all-to-all swaps sequence sharding for head sharding: each rank receives every token for 1/c of the
query heads and of the KV groups, reorders them into the global packed order and calls
`kernels.attention` with the global cu_seqlens (so a row sees exactly the keys it sees at CP=1); a
second all-to-all returns each rank its own tokens with all heads. Needs KV groups (per TP rank)
divisible by c. Attention rows do not depend on trailing pad keys (causal), so padding is invisible.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from top_rl import kernels
from top_rl.kernels.packed_batch import packed_batch
from top_rl.train.batch import cp_positions


class _AllToAll(torch.autograd.Function):
    """x[c, ...] -> y[c, ...] with y[i] on rank r = x[r] of rank i (its own inverse, so also its backward)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _a2a(x, group)

    @staticmethod
    def backward(ctx, g):
        return _a2a(g, ctx.group), None


def _a2a(x, group):
    x = x.contiguous()
    out = torch.empty_like(x)  # after contiguous(): empty_like of a strided view would keep its strides
    dist.all_to_all_single(out, x, group=group)
    return out


def _heads_to_ranks(x, c):
    """[t, H, d] -> [c, t, H/c, d]: head chunk j goes to rank j."""
    t, h, d = x.shape
    return x.reshape(t, c, h // c, d).transpose(0, 1)


def ulysses_attention(q, k, v, packed_seq_params, scale, cp_group) -> torch.Tensor:
    c = dist.get_world_size(cp_group)
    if q.shape[1] % c or k.shape[1] % c:
        raise ValueError(f"Ulysses CP={c} needs query heads ({q.shape[1]}) and KV groups ({k.shape[1]}) per "
                         "TP rank divisible by the CP size")
    cu = packed_seq_params.cu_seqlens_q
    batch = packed_batch(cu)
    # Global positions of the rank-major concatenation of every rank's local tokens, and its inverse; built once
    # per batch (a host-to-device copy per layer would stall the stream as a read does).
    order = batch.derived(("ulysses_order", c, q.device), lambda: torch.tensor(
        [p for r in range(c) for p in cp_positions(list(batch.bounds), c, r)], device=q.device))
    to_global = batch.derived(("ulysses_to_global", c, q.device), lambda: torch.argsort(order))

    def gather(x):  # local tokens, all heads -> all tokens (global order), this rank's heads
        y = _AllToAll.apply(_heads_to_ranks(x, c), cp_group)  # [c(source rank), t, H/c, d]
        return y.reshape(-1, *y.shape[2:]).index_select(0, to_global)

    out = kernels.attention(gather(q), gather(k), gather(v), cu, scale)  # [T, Hq/c, d]
    t = q.shape[0]
    back = out.index_select(0, order).reshape(c, t, *out.shape[1:])  # [c(owner rank), t, Hq/c, d]
    y = _AllToAll.apply(back, cp_group)  # [c(head chunk), t, Hq/c, d]
    return y.transpose(0, 1).reshape(t, q.shape[1], q.shape[2])
