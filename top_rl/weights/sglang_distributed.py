"""Rank 0's side of SGLang's update_weights_from_distributed (docs/numerics.md §9): servers join a process group
with the trainer as rank 0 (POST /init_weights_update_group); per bucket, each server gets POST
/update_weights_from_distributed with names/dtypes/shapes and posts receives, while the trainer broadcasts the same
tensors in the same order (one uint8 buffer per bucket when flattened, the layout of SGLang's
FlattenedTensorBucket). The HTTP call returns only after the broadcast, so the POST is issued first (thread, Ray
task) and then the trainer broadcasts: `sync_distributed` orders this. The requests themselves are the engine's
(its join_weight_group and receive_bucket: top_rl.engine.interface.EngineWeights)."""

from __future__ import annotations

from typing import Callable, Iterable

import torch

from top_rl.engine.interface import EngineWeights
from top_rl.weights.base import WeightRequest, WeightTransport
from top_rl.weights.buckets import Bucket, bucket_meta, buckets, flatten
from top_rl.weights.transport import Link, Placement, Transport, TransportSetting


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
    of the engine's receive_bucket: names, dtypes, shapes, and weight_version, set on the last bucket only (the
    servers flip their version, and flush, once every bucket is in). Returns the bucket count. With Ray, from the
    trainer's rank 0: SglangDistributed.send below."""
    bks = buckets(named, bucket_bytes)
    for k, bucket in enumerate(bks):
        wait = post({**bucket_meta(bucket), "weight_version": weight_version if k == len(bks) - 1 else None})
        broadcast(bucket)
        wait()
    return len(bks)


class SglangDistributed(WeightTransport):
    """Bucket by bucket: the server's receive request (by the engine's actor, on its own thread of the call), then
    rank 0's broadcast (`sync_distributed`). Its failure is the engine's (reported like the others), not rank 0's.
    The group's engine ranks are the server's own, so the engine's end holds no group: the server does."""

    kind, setting, engine_kind = Transport.sglang_distributed, TransportSetting.broadcast, "sglang"

    @classmethod
    def refusal(cls, where: Placement) -> str | None:
        return where.group_refusal()

    @classmethod
    def auto_fits(cls, where: Placement) -> bool:
        return where.on_gpus and not where.same_gpu

    @classmethod
    def connect(cls, link: Link, engine, store=None, host=None, port=None, name=None) -> "SglangDistributed":
        from torch.distributed.constants import default_pg_timeout

        group = init_trainer_group(host, port, link.world, name, link.backend, store=store(link.world, default_pg_timeout))
        return cls(engine, link, group)

    def send(self, out, version: int):
        import functools

        import ray

        def post(meta):
            bucket = {k: v for k, v in meta.items() if k != "weight_version"}
            return functools.partial(ray.get, self.request(version, bucket, meta["weight_version"] is not None))

        send = functools.partial(broadcast_bucket, group=self.group, flattened=self.link.flattened)
        try:
            sync_distributed(out.named, out.bucket_bytes, post, send, weight_version=str(version))
        except Exception as e:  # noqa: BLE001 - reported per engine; the driver restarts it
            def failed(e=e):
                raise e
            return failed
        return lambda: None

    @classmethod
    def join(cls, link: Link, engine: EngineWeights, name=None, host=None, port=None, store=None) -> "SglangDistributed":
        engine.join_weight_group(host, port, link.backend, name)  # the server's own ranks join (SGLang's request)
        return cls(None, link)

    def receive(self, engine: EngineWeights, request: WeightRequest) -> int | None:
        """One bucket's receive (returns after rank 0's broadcast of it); the last flips the server's version."""
        engine.receive_bucket(**request.payload, weight_version=str(request.version) if request.last else None)
        return request.version if request.last else None
