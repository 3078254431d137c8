"""The one table of variants and the choice among them (`choose`, `link`: each variant's own rule, read in the
table's order), and trainer rank 0's side of a push: `connect` makes each engine's transport once (at start, after a
restart), then a push is one loop over them (`push`). Each send starts its engine's receive and hands back a waiter;
rank 0 waits on all of them only after every engine has been sent to, so engines load concurrently. A new variant is
one class (top_rl.weights.base.WeightTransport) and one entry here."""

from __future__ import annotations

import datetime
from typing import Callable

from top_rl.weights.base import Outgoing, WeightTransport
from top_rl.weights.native import Broadcast, Ipc, ObjectStore, SglangDisk
from top_rl.weights.sglang_distributed import SglangDistributed
from top_rl.weights.sglang_ipc import SglangIpc
from top_rl.weights.transport import Endpoint, Link, Placement, Transport, TransportSetting, refusal

# The variants (top_rl.weights.transport's module doc), by the name a Link carries; for each kind of engine, fastest
# first: `auto` takes the first whose rule fits the placement.
TRANSPORTS: dict[Transport, type[WeightTransport]] = {
    cls.kind: cls for cls in (Ipc, Broadcast, ObjectStore, SglangIpc, SglangDistributed, SglangDisk)}
# (world, timeout) -> the rendezvous store rank 0 serves for a group (top_rl.driver.rendezvous.store)
StoreFactory = Callable[[int, datetime.timedelta], object]


def choose(setting: str, engine_kind: str, trainer: Endpoint, engine: Endpoint) -> Transport:
    """The variant for one engine: what `setting` allows where the two ends compute, by the variants' own rules."""
    why = refusal(setting, engine_kind)
    if why:
        raise ValueError(why)
    setting, where = TransportSetting(setting), Placement(trainer, engine)
    kinds = [cls for cls in TRANSPORTS.values() if cls.engine_kind == engine_kind]
    if setting == TransportSetting.auto:
        return next(cls.kind for cls in kinds if cls.auto_fits(where))
    named = next(cls for cls in kinds if cls.setting == setting)
    why = named.refusal(where)
    if why:
        raise ValueError(why)
    return named.kind


def link(setting: str, trainer: Endpoint, engine: Endpoint, sglang=None) -> Link:
    """One engine's link. `sglang`: its server config (top_rl.rollout.sglang.config.SglangEngineConfig, duck-typed:
    this package reads only the protocol from rollout), None for a native engine: an SGLang group holds rank 0 and the
    server's tp_size ranks, NCCL if rank 0 has a GPU, else gloo, and takes its name from weight_group_name."""
    if sglang is None:
        return Link(choose(setting, "native", trainer, engine))
    return Link(choose(setting, "sglang", trainer, engine), sglang.tp_size, "nccl" if trainer.gpu else "gloo",
                bool(sglang.flattened_buckets), sglang.weight_group_name)


def connect(link: Link, engine, store: StoreFactory | None = None, host: str | None = None, port: int | None = None,
            name: str | None = None) -> WeightTransport:
    """Rank 0's end of one engine's link; for a process group, made while the engine joins at host:port."""
    return TRANSPORTS[link.transport].connect(link, engine, store, host, port, name)


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
