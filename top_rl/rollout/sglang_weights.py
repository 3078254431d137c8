"""Weight sync to SGLang servers: buckets, the trainer side of the NCCL broadcast, disk export, tensor payloads.

Three modes (docs/numerics.md §9):
- disk: an HF checkpoint (safetensors, dtypes kept: fp32 norms/embedding stay fp32, §3) is written where the
  server can read it (by the engine actor next to its server, from tensors Ray ships, or by the trainer to a
  shared filesystem); the server reloads it with POST /update_weights_from_disk.
- distributed: servers join a process group with the trainer as rank 0 (POST /init_weights_update_group); per
  bucket, each server gets POST /update_weights_from_distributed with names/dtypes/shapes and posts receives,
  while the trainer broadcasts the same tensors in the same order (one uint8 buffer per bucket when flattened,
  the layout of SGLang's FlattenedTensorBucket). The HTTP call returns only after the broadcast, so the POST
  is issued first (thread, Ray task) and then the trainer broadcasts: `sync_distributed` orders this.
- tensor: colocated engines only: the payload carries CUDA IPC handles (torch's multiprocessing reductions), so
  the sender must be a process on the same host and keep the tensors alive until the POST returns.
"""

from __future__ import annotations

import math
import os
import shutil
from pathlib import Path
from typing import Callable, Iterable

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


# ------------------------------------------------------------------------------------ distributed
def init_trainer_group(master_address: str, master_port: int, world_size: int, group_name: str,
                       backend: str = "nccl", store=None):
    """The trainer's end (rank 0) of the group the servers join; it is not the default process group, so it
    coexists with Megatron's groups. Uses the pinned SGLang's own helper, as the servers do. `store`: the rendezvous
    store this process serves at master_address:master_port (top_rl.driver.rendezvous.store: bound to that address only;
    without it SGLang's helper binds its own TCPStore, which listens on every interface). The servers reach it with
    `tcp://` and key it under the group's name (a PrefixStore), so this end does the same."""
    from sglang.srt.utils.common import init_custom_process_group

    if store is None:
        return init_custom_process_group(backend=backend, init_method=f"tcp://{master_address}:{master_port}",
                                         world_size=world_size, rank=0, group_name=group_name)
    import torch.distributed as dist

    return init_custom_process_group(backend=backend, store=dist.PrefixStore(group_name, store),
                                     world_size=world_size, rank=0, group_name=group_name)


def broadcast_bucket(bucket: Bucket, group, flattened: bool) -> None:
    """Rank 0's side of one bucket, matching the server's receives (one buffer, or one call per tensor)."""
    import torch.distributed as dist

    if flattened:
        dist.broadcast(flatten(bucket), src=0, group=group)
        return
    handles = [dist.broadcast(t.detach().contiguous(), src=0, group=group, async_op=True) for _, t in bucket]
    for h in handles:
        h.wait()


def sync_distributed(named: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int,
                     post: Callable[[dict], Callable[[], None]], broadcast: Callable[[Bucket], None],
                     weight_version: str | None = None) -> int:
    """Per bucket: `post(meta)` starts the servers' receive request(s) and returns a waiter; `broadcast(bucket)`
    sends the tensors (the trainer's hook); the waiter raises if a server failed. `meta` is the keyword arguments
    of SglangEngine.update_weights_from_distributed: names, dtypes, shapes, and weight_version, set on the last
    bucket only (the servers flip their version, and flush, once every bucket is in). Returns the bucket count.
    With Ray, from the trainer's rank 0:
        post = lambda m: functools.partial(ray.get, [e.update_weights_from_distributed.remote(**m) for e in engines])
    """
    bks = buckets(named, bucket_bytes)
    for k, bucket in enumerate(bks):
        wait = post({**bucket_meta(bucket), "weight_version": weight_version if k == len(bks) - 1 else None})
        broadcast(bucket)
        wait()
    return len(bks)


# ------------------------------------------------------------------------------------ tensor (colocated)
def tensor_payload(bucket: Bucket, tp_size: int, flattened: bool) -> tuple[list[str], str | None]:
    """(serialized_named_tensors, load_format) for POST /update_weights_from_tensor: one base64 entry per
    server TP rank, made with SGLang's own serializer (CUDA tensors become IPC handles)."""
    from sglang.srt.utils.common import MultiprocessingSerializer
    from sglang.srt.utils.patch_torch import monkey_patch_torch_reductions

    if any(t.is_cuda for _, t in bucket):
        monkey_patch_torch_reductions()  # CUDA devices by UUID, as the receiving worker expects
    if flattened:
        from sglang.srt.weight_sync.tensor_bucket import FlattenedTensorBucket

        b = FlattenedTensorBucket(named_tensors=[(n, t.detach().contiguous()) for n, t in bucket])
        obj, fmt = {"flattened_tensor": b.get_flattened_tensor(), "metadata": b.get_metadata()}, "flattened_bucket"
    else:
        obj, fmt = [(n, t.detach().contiguous()) for n, t in bucket], None
    return [MultiprocessingSerializer.serialize(obj, output_str=True) for _ in range(tp_size)], fmt


# ------------------------------------------------------------------------------------ disk
_MAX_SHARD = 4 << 30


def write_hf_checkpoint(sd: dict[str, torch.Tensor], out_dir: str | Path, config_from: str | Path | None) -> Path:
    """Safetensors (+ config.json and generation_config.json copied from `config_from`) written under a
    temporary name and renamed, so a server never reads a half-written version."""
    from top_rl.model.hf_io import write_hf

    out = Path(out_dir)
    tmp = out.with_name(f".{out.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    write_hf(sd, tmp, None, _MAX_SHARD)
    if config_from is not None and Path(config_from).is_dir():
        for f in ("config.json", "generation_config.json"):
            if (Path(config_from) / f).is_file():
                shutil.copy(Path(config_from) / f, tmp / f)
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
    return out
