"""Trainer rank 0's side of a push, and the one table of variants: `connect` makes each engine's transport once
(at start, after a restart), then a push is one loop over them (`push`). Each send starts its engine's receive and
hands back a waiter; rank 0 waits on all of them only after every engine has been sent to, so engines load
concurrently."""

from __future__ import annotations

import datetime
from typing import Callable

from top_rl.weights.base import Outgoing, WeightTransport
from top_rl.weights.group import GROUP_TIMEOUT, Group
from top_rl.weights.native import Broadcast, Ipc, ObjectStore, SglangDisk
from top_rl.weights.sglang_distributed import SglangDistributed, init_trainer_group
from top_rl.weights.sglang_ipc import SglangIpc
from top_rl.weights.transport import Link, Transport

# The variants (top_rl.weights.transport's module doc), by the name a Link carries.
TRANSPORTS: dict[Transport, type[WeightTransport]] = {
    cls.kind: cls for cls in (ObjectStore, Broadcast, Ipc, SglangDisk, SglangIpc, SglangDistributed)}
# (world, timeout) -> the rendezvous store rank 0 serves for a group (top_rl.driver.rendezvous.store)
StoreFactory = Callable[[int, datetime.timedelta], object]


def connect(link: Link, engine, store: StoreFactory | None = None, host: str | None = None, port: int | None = None,
            name: str | None = None) -> WeightTransport:
    """Rank 0's end of one engine's link; for a process group, made while the engine joins at host:port."""
    cls = TRANSPORTS[link.transport]
    if link.transport == Transport.broadcast:
        return cls(engine, link, Group(store(link.world, GROUP_TIMEOUT), 0, link.world, name))
    if link.transport == Transport.sglang_distributed:
        from torch.distributed.constants import default_pg_timeout

        group = init_trainer_group(host, port, link.world, name, link.backend, store=store(link.world, default_pg_timeout))
        return cls(engine, link, group)
    return cls(engine, link)


def push(transports: list[tuple[int, WeightTransport]], named: list, version: int,
         bucket_bytes: int) -> list[tuple[int, str | None]]:
    """Send `version` to every (engine index, transport); (engine index, error or None) per engine: a dead engine is
    the driver's to restart."""
    out = Outgoing(named, bucket_bytes)
    started = []
    for i, t in transports:
        try:
            started.append((i, t.send(out, version)))
        except Exception as e:  # noqa: BLE001 - a send that fails is that engine's failure, reported like a receive
            started.append((i, _raiser(e)))
    results = []
    for i, wait in started:
        try:
            wait()
            results.append((i, None))
        except Exception as e:  # noqa: BLE001 - reported per engine; the driver restarts it
            results.append((i, " ".join(str(e).split())[:600]))
    return results


def _raiser(e: Exception):
    def failed():
        raise e
    return failed
