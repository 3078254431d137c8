"""An engine's side: the weights of one version, whole, from what its transport delivered (an SGLang server with
weight_sync=distributed receives bucket by bucket itself, top_rl.rollout.sglang)."""

from __future__ import annotations

import torch

from top_rl.weights.buckets import meta_bytes, unflatten
from top_rl.weights.group import Group
from top_rl.weights.transport import Transport


def receive(transport: Transport, payload, group: Group | None) -> dict[str, torch.Tensor]:
    """`payload`: the weights (object store), the buckets' metadata (broadcast), or (IPC handles, metadata)."""
    if transport == Transport.object_store:
        return payload
    if transport == Transport.broadcast:
        return receive_broadcast(group, payload)
    if transport == Transport.ipc:
        return receive_ipc(*payload)
    raise ValueError(f"weights sent by {transport} are not received whole")


def receive_broadcast(group: Group, metas: list[dict]) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for meta in metas:
        buf = torch.empty(meta_bytes(meta), dtype=torch.uint8, device=group.device)
        group.broadcast(buf)
        out.update(unflatten(buf, meta))
    return out


def receive_ipc(handles: list, metas: list[dict]) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for (rebuild, args), meta in zip(handles, metas):
        buf = rebuild(*args)
        out.update({n: t.clone() for n, t in unflatten(buf, meta)})  # own copies: rank 0 frees its buffers
        del buf
    torch.cuda.synchronize()
    return out
