"""Weights from the trainer to the rollout engines, sent by the trainer itself.

Every trainer rank takes part in gathering the full HF-named weights (TP all-gather, PP broadcast:
`Trainer.iter_hf_weights`); trainer rank 0 then sends one copy to each engine, by the transport its
placement allows:
  broadcast     a process group of rank 0 and that engine (NCCL between GPUs, gloo on CPU); one flat
                uint8 buffer per bucket, the layout SGLang's FlattenedTensorBucket uses
  ipc           an engine on rank 0's own GPU (NCCL cannot join two ranks on one device): CUDA IPC
                handles of rank 0's buckets; the engine copies out before rank 0 frees them
  object_store  one `ray.put` of CPU tensors, shared by every such engine (CPU engines or trainer)
`cluster.weight_transport=auto` picks broadcast / ipc on GPUs and the object store on CPU; `broadcast`
forces process groups (gloo on CPU: the CI path), `object_store` forces the object store.
SGLang servers take weights their own way (rollout.sglang.weight_sync; top_rl.rollout.sglang): `distributed`
is the broadcast transport with the server as the receiver; disk and tensor go through the engine actor.
"""

from __future__ import annotations

import datetime
import math
from dataclasses import dataclass

import torch
import torch.distributed as dist

from top_rl.driver.placement import WeightTransport
from top_rl.rollout.sglang_weights import Bucket, bucket_meta, buckets, flatten, unflatten

GROUP_TIMEOUT = datetime.timedelta(minutes=10)


@dataclass(frozen=True)
class Endpoint:
    """Where a process computes: its node's address and its GPU's UUID (None on CPU)."""

    node: str
    gpu: str | None

    @classmethod
    def here(cls) -> "Endpoint":
        import ray

        gpu = None
        if torch.cuda.is_available():
            gpu = str(torch.cuda.get_device_properties(torch.cuda.current_device()).uuid)
        return cls(ray.util.get_node_ip_address(), gpu)


def choose(setting: str, trainer: Endpoint, engine: Endpoint) -> str:
    """The transport for one engine (see module doc)."""
    setting = WeightTransport(setting)  # refuses anything else, naming the choices
    same_gpu = trainer.gpu is not None and trainer.gpu == engine.gpu
    if setting == "object_store":
        return "object_store"
    if setting == "broadcast":
        if same_gpu:
            raise ValueError("cluster.weight_transport=broadcast, but a rollout engine shares trainer rank 0's GPU "
                             f"({engine.gpu}): NCCL cannot put two ranks on one device; use auto (CUDA IPC there)")
        if (trainer.gpu is None) != (engine.gpu is None):
            raise ValueError("cluster.weight_transport=broadcast needs the trainer and the engines on the same kind of "
                             "device (both GPU: NCCL, both CPU: gloo); use auto or object_store")
        return "broadcast"
    if trainer.gpu is None or engine.gpu is None:
        return "object_store"
    return "ipc" if same_gpu else "broadcast"


class Group:
    """A process group outside torch's default one (the trainer's ranks own that): rank 0 is the trainer's
    rank 0, which hosts the rendezvous store on its node."""

    def __init__(self, host: str, port: int, rank: int, world: int, name: str):
        from top_rl.driver import rendezvous

        store = rendezvous.store(host, port, world, rank, GROUP_TIMEOUT)  # rank 0 reserved host:port
        store = dist.PrefixStore(name, store)
        if torch.cuda.is_available():
            self.device = torch.device("cuda", torch.cuda.current_device())
            self.pg = dist.ProcessGroupNCCL(store, rank, world)
        else:
            self.device = torch.device("cpu")
            self.pg = dist.ProcessGroupGloo(store, rank, world, GROUP_TIMEOUT)
        self._store = store  # the master store lives as long as the group

    def broadcast(self, tensor: torch.Tensor) -> None:
        self.pg.broadcast(tensor, 0).wait()
        if tensor.is_cuda:
            torch.cuda.current_stream().synchronize()


def plan_buckets(named, bucket_bytes: int) -> tuple[list[Bucket], list[dict]]:
    bks = buckets(named, bucket_bytes)
    return bks, [bucket_meta(b) for b in bks]


def bucket_bytes(meta: dict) -> int:
    return sum(getattr(torch, d).itemsize * math.prod(s) for d, s in zip(meta["dtypes"], meta["shapes"]))


# ----------------------------------------------------------------------------------- senders (rank 0)
def send_broadcast(group: Group, bks: list[Bucket]) -> None:
    for b in bks:
        group.broadcast(flatten(b).to(group.device))


def ipc_handles(bks: list[Bucket]) -> tuple[list, list[torch.Tensor]]:
    """(handles, buffers): rank 0 keeps `buffers` alive until the engine has copied them."""
    from torch.multiprocessing.reductions import reduce_tensor

    bufs = [flatten(b).cuda() for b in bks]
    torch.cuda.synchronize()
    return [reduce_tensor(buf) for buf in bufs], bufs


# ----------------------------------------------------------------------------------- receivers (engines)
def receive_broadcast(group: Group, metas: list[dict]) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for meta in metas:
        buf = torch.empty(bucket_bytes(meta), dtype=torch.uint8, device=group.device)
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
