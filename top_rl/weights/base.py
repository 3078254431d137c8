"""What every weight transport shares: one version's weights on rank 0 (`Outgoing`), and the shape of a variant
(`WeightTransport`): one class per way the weights travel, owning both ends. Rank 0 makes one instance per engine
when it connects to it and calls `send` on every push; the engine's actor calls the class's `join` once per
connection (process groups only) and `receive` on every push. The variants and the table that names them:
top_rl.weights.senders; which one an engine gets: top_rl.weights.transport."""

from __future__ import annotations

from typing import Callable, ClassVar

import torch

from top_rl.weights.buckets import bucket_meta, buckets, flatten
from top_rl.weights.transport import Link, Transport

Wait = Callable[[], object]  # raises if the engine failed to take the version


class Outgoing:
    """One version's weights on rank 0, shared by every engine's send of a push: the buckets with their metadata, and
    (each made on first use) one object-store copy for every object-store engine, and the flat device buffers."""

    def __init__(self, named: list, bucket_bytes: int):
        self.named, self.bucket_bytes = named, bucket_bytes
        self.buckets = buckets(named, bucket_bytes)
        self.metas = [bucket_meta(b) for b in self.buckets]
        self._ref = None
        self._flat: list[torch.Tensor] | None = None

    def object_ref(self):
        if self._ref is None:
            import ray

            self._ref = ray.put({n: t.cpu() for n, t in self.named})
        return self._ref

    def flat_on_device(self) -> list[torch.Tensor]:
        """Each bucket as one uint8 buffer on rank 0's device (SGLang's FlattenedTensorBucket layout)."""
        if self._flat is None:
            device = self.named[0][1].device if self.named else torch.device("cpu")
            self._flat = [flatten(b).to(device) for b in self.buckets]
            if device.type == "cuda":
                torch.cuda.synchronize()  # the buffers are whole before another process reads them
        return self._flat


class WeightTransport:
    """One variant. Rank 0's end: `__init__` at connect (with its process group, if any), `send` per push, `close`
    before a restarted engine's new connection. The engine's end: the static `join` and `receive`, called in the
    engine's actor (`actor.engine` is its rollout engine, `actor.group` the group `join` made)."""

    kind: ClassVar[Transport]

    def __init__(self, engine, link: Link, group=None):
        self.engine, self.link, self.group = engine, link, group  # engine: the engine actor's handle

    def send(self, out: Outgoing, version: int) -> Wait:
        raise NotImplementedError

    def close(self) -> None:
        """Before this engine's connection is replaced (the engine was restarted)."""

    @staticmethod
    def join(actor, link: Link, name: str, host: str, port: int, store) -> None:
        """The engine's side of the connection (process groups only), at rank 0's host:port; `store(world, rank,
        timeout)` is the rendezvous store there (top_rl.driver.rendezvous.store)."""

    @staticmethod
    def receive(actor, payload, version: int) -> None:
        raise NotImplementedError
