"""Trainer rank 0's side: one sender per engine, made once when the trainer connects to it (`connect`), then a
weight push is one loop over the chosen senders (`push`). Each sender starts its engine's receive, sends, and
hands back a waiter; rank 0 waits on all of them only after every engine has been sent to, so object-store and
IPC engines load concurrently."""

from __future__ import annotations

import datetime
import functools
from typing import Callable

import ray
import torch

from top_rl.weights.buckets import buckets, bucket_meta, flatten
from top_rl.weights.group import GROUP_TIMEOUT, Group
from top_rl.weights.sglang_distributed import broadcast_bucket, init_trainer_group, sync_distributed
from top_rl.weights.transport import Link, Transport

Wait = Callable[[], object]  # raises if the engine failed to take the version
# (world, timeout) -> the rendezvous store rank 0 serves for a group (top_rl.driver.rendezvous.store)
StoreFactory = Callable[[int, datetime.timedelta], object]


class Outgoing:
    """One version's weights on rank 0, shared by every sender of a push: the buckets with their metadata, and
    (made on first use) one object-store copy for every object-store engine."""

    def __init__(self, named: list, bucket_bytes: int):
        self.named, self.bucket_bytes = named, bucket_bytes
        self.buckets = buckets(named, bucket_bytes)
        self.metas = [bucket_meta(b) for b in self.buckets]
        self._ref = None

    def object_ref(self):
        if self._ref is None:
            self._ref = ray.put({n: t.cpu() for n, t in self.named})
        return self._ref


class Sender:
    def __init__(self, engine):
        self.engine = engine  # the engine actor's handle (top_rl.driver.actors.EngineActor)

    def send(self, out: Outgoing, version: int) -> Wait:
        raise NotImplementedError

    def close(self) -> None:
        """Before this engine's sender is replaced (the engine was restarted)."""


class ObjectStoreSender(Sender):
    def send(self, out: Outgoing, version: int) -> Wait:
        return functools.partial(ray.get, self.engine.receive_weights.remote(Transport.object_store, out.object_ref(),
                                                                              version))


class BroadcastSender(Sender):
    def __init__(self, engine, group: Group):
        super().__init__(engine)
        self.group = group

    def send(self, out: Outgoing, version: int) -> Wait:
        ref = self.engine.receive_weights.remote(Transport.broadcast, out.metas, version)
        for b in out.buckets:
            self.group.broadcast(flatten(b).to(self.group.device))
        return functools.partial(ray.get, ref)

    def close(self) -> None:
        self.group.abort()


class IpcSender(Sender):
    def send(self, out: Outgoing, version: int) -> Wait:
        from torch.multiprocessing.reductions import reduce_tensor

        bufs = [flatten(b).cuda() for b in out.buckets]
        torch.cuda.synchronize()
        ref = self.engine.receive_weights.remote(Transport.ipc, ([reduce_tensor(b) for b in bufs], out.metas), version)

        def wait(bufs=bufs):  # rank 0 keeps its buffers until the engine has copied them out
            return ray.get(ref)
        return wait


class SglangDistributedSender(Sender):
    """Bucket by bucket: the server's receive request, then rank 0's broadcast (sglang_distributed.sync_distributed).
    Its failure is the engine's (reported like the others), not rank 0's."""

    def __init__(self, engine, group, flattened: bool):
        super().__init__(engine)
        self.group, self.flattened = group, flattened

    def send(self, out: Outgoing, version: int) -> Wait:
        def post(meta):
            return functools.partial(ray.get, self.engine.sglang_receive_bucket.remote(**meta))

        send = functools.partial(broadcast_bucket, group=self.group, flattened=self.flattened)
        try:
            sync_distributed(out.named, out.bucket_bytes, post, send, weight_version=str(version))
        except Exception as e:  # noqa: BLE001 - reported per engine; the driver restarts it
            def failed(e=e):
                raise e
            return failed
        return lambda: None


def connect(link: Link, engine, store: StoreFactory | None = None, host: str | None = None, port: int | None = None,
            name: str | None = None) -> Sender:
    """Rank 0's end of one engine's link; for a process group, made while the engine joins at host:port."""
    if link.transport == Transport.object_store:
        return ObjectStoreSender(engine)
    if link.transport == Transport.ipc:
        return IpcSender(engine)
    if link.transport == Transport.broadcast:
        return BroadcastSender(engine, Group(store(link.world, GROUP_TIMEOUT), 0, link.world, name))
    from torch.distributed.constants import default_pg_timeout

    group = init_trainer_group(host, port, link.world, name, link.backend, store=store(link.world, default_pg_timeout))
    return SglangDistributedSender(engine, group, link.flattened)


def push(senders: list[tuple[int, Sender]], named: list, version: int,
         bucket_bytes: int) -> list[tuple[int, str | None]]:
    """Send `version` to every (engine index, sender); (engine index, error or None) per engine: a dead engine is the
    driver's to restart."""
    out = Outgoing(named, bucket_bytes)
    started = [(i, sender.send(out, version)) for i, sender in senders]
    results = []
    for i, wait in started:
        try:
            wait()
            results.append((i, None))
        except Exception as e:  # noqa: BLE001 - reported per engine; the driver restarts it
            results.append((i, " ".join(str(e).split())[:600]))
    return results
