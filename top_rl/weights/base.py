"""What every weight transport shares: one version's weights on rank 0 (`Outgoing`), the one request an engine's actor
takes (`WeightRequest`), and the shape of a variant (`WeightTransport`): one class per way the weights travel, owning
both ends and the rule of where it fits. Rank 0 makes one instance per engine when it connects to it (`connect`) and
calls `send` on every push; the engine's actor makes the other end when it joins (`join`, the process group the
variant needs held by that instance) and hands every request to its `receive`, which calls only the engine's weight
protocol (top_rl.engine.interface.EngineWeights). The two rules more than one variant shares are bases here: CUDA IPC
on rank 0's GPU (`SameGpuTransport`) and a process group between two devices (`GroupTransport`). The variants and the
table that names them: top_rl.weights.senders."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, ClassVar

import torch

from top_rl.engine.interface import EngineWeights
from top_rl.weights.buckets import bucket_meta, buckets, flatten, unflatten
from top_rl.weights.transport import Link, Placement, Transport, TransportSetting

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
        """One `ray.put` of the buckets as host byte arrays (numpy uint8, which Ray stores without pickling) with
        their metadata: `object_store_named` turns it back into the tensors, bit for bit. Not the tensors themselves:
        megatron-core replaces torch.storage._load_from_bytes with its own function (megatron/core/__init__.py), so a
        tensor pickled on a trainer rank names megatron.core, and the engine that unpickles it imported all of
        megatron-core first (~6 s on a 2-core machine, measured at a run's first push)."""
        if self._ref is None:
            import ray

            self._ref = ray.put(self.object_store_payload())
        return self._ref

    def object_store_payload(self) -> tuple[list, list[dict]]:
        """(each bucket's bytes as a host numpy uint8 array, each bucket's metadata): what `object_ref` puts."""
        return [flatten(b).cpu().numpy() for b in self.buckets], self.metas

    def flat_on_device(self) -> list[torch.Tensor]:
        """Each bucket as one uint8 buffer on rank 0's device (SGLang's FlattenedTensorBucket layout)."""
        if self._flat is None:
            device = self.named[0][1].device if self.named else torch.device("cpu")
            self._flat = [flatten(b).to(device) for b in self.buckets]
            if device.type == "cuda":
                torch.cuda.synchronize()  # the buffers are whole before another process reads them
        return self._flat


def object_store_named(payload) -> dict[str, torch.Tensor]:
    """The tensors of an `Outgoing.object_ref()` payload, by name (views of the object store's read-only copy: the
    engine copies them into its own parameters)."""
    import warnings

    arrays, metas = payload
    out: dict[str, torch.Tensor] = {}
    for array, meta in zip(arrays, metas):
        if not array.size:  # torch.frombuffer refuses an empty buffer
            out.update(unflatten(torch.empty(0, dtype=torch.uint8), meta))
            continue
        with warnings.catch_warnings():  # "not writable": nothing writes to them
            warnings.simplefilter("ignore", UserWarning)
            out.update(unflatten(torch.frombuffer(memoryview(array), dtype=torch.uint8), meta))
    return out


@dataclass(frozen=True)
class WeightRequest:
    """What rank 0 sends an engine's actor (its one weight door, EngineActor.receive_weights): `payload` of weight
    version `version` by variant `transport`; `last` False for a bucket that is not the version's last."""

    transport: Transport
    version: int
    payload: Any
    last: bool = True


class WeightTransport:
    """One variant. The rule: `setting` (the cluster.weight_transport value that names it), `engine_kind`, and the
    class methods `refusal` (it cannot join the two ends) and `auto_fits` (auto picks it; the table is fastest first).
    Rank 0's end: `connect` (with its process group, if any), `send` per push, `close` before a restarted engine's new
    connection. The engine's end: `join` (in the engine's actor, with the group it makes) and `receive` per request."""

    kind: ClassVar[Transport]
    setting: ClassVar[TransportSetting]
    engine_kind: ClassVar[str]  # native | sglang

    def __init__(self, engine, link: Link, group=None):
        """`engine`: the engine actor's handle at rank 0's end (None at the engine's); `group`: this end's group."""
        self.engine, self.link, self.group = engine, link, group

    # ------------------------------------------------------------------ the rule
    @classmethod
    def refusal(cls, where: Placement) -> str | None:
        """Why this variant cannot join trainer rank 0 and the engine placed so, or None."""
        return None

    @classmethod
    def auto_fits(cls, where: Placement) -> bool:
        """Whether cluster.weight_transport=auto picks this variant (the first in the table that fits)."""
        return True

    # ------------------------------------------------------------------ rank 0's end
    @classmethod
    def connect(cls, link: Link, engine, store=None, host: str | None = None, port: int | None = None,
                name: str | None = None) -> "WeightTransport":
        """Rank 0's end of one engine's link; for a process group, made while the engine joins at host:port with
        `store(world, timeout)`, the rendezvous store rank 0 serves there (top_rl.driver.rendezvous.store)."""
        return cls(engine, link)

    def send(self, out: Outgoing, version: int) -> Wait:
        raise NotImplementedError

    def close(self) -> None:
        """Before this engine's connection is replaced (the engine was restarted)."""

    def request(self, version: int, payload, last: bool = True):
        """Start the engine actor's receive of `payload` (a Ray call to its one weight door); its object ref."""
        return self.engine.receive_weights.remote(WeightRequest(self.kind, version, payload, last))

    # ------------------------------------------------------------------ the engine's end
    @classmethod
    def join(cls, link: Link, engine: EngineWeights, name: str | None = None, host: str | None = None,
             port: int | None = None, store=None) -> "WeightTransport":
        """The engine's end of the connection, in its actor; for a process group, rank 0's at host:port, where
        `store(world, rank, timeout)` is the rendezvous store (top_rl.driver.rendezvous.store)."""
        return cls(None, link)

    def receive(self, engine: EngineWeights, request: WeightRequest) -> int | None:
        """Load `request` into `engine` through its weight protocol; the version it now holds (None: a bucket that is
        not the last)."""
        raise NotImplementedError


class SameGpuTransport(WeightTransport):
    """The rule of a variant over CUDA IPC (native Ipc, SglangIpc): the engine shares rank 0's GPU, where NCCL cannot
    join the two ends, so auto picks it there and only there."""

    @classmethod
    def refusal(cls, where: Placement) -> str | None:
        if where.same_gpu:
            return None
        return (f"cluster.weight_transport=ipc, but a rollout engine ({where.engine.gpu or 'CPU'}) does not share "
                f"trainer rank 0's GPU ({where.trainer.gpu or 'CPU'}): CUDA IPC needs one device; use auto")

    @classmethod
    def auto_fits(cls, where: Placement) -> bool:
        return where.same_gpu


class GroupTransport(WeightTransport):
    """The rule of a variant over a process group of rank 0 and the engine (native Broadcast, SglangDistributed): two
    devices of one kind (NCCL between GPUs, gloo on CPU); auto picks it between two GPUs only (on CPU: the object store
    or disk, top_rl.weights.transport's module doc)."""

    @classmethod
    def refusal(cls, where: Placement) -> str | None:
        if where.same_gpu:
            return ("cluster.weight_transport=broadcast, but a rollout engine shares trainer rank 0's GPU "
                    f"({where.engine.gpu}): NCCL cannot put two ranks on one device; use auto (CUDA IPC there)")
        if (where.trainer.gpu is None) != (where.engine.gpu is None):
            return ("cluster.weight_transport=broadcast needs the trainer and the engines on the same kind of "
                    "device (both GPU: NCCL, both CPU: gloo); use auto or object_store")
        return None

    @classmethod
    def auto_fits(cls, where: Placement) -> bool:
        return where.on_gpus and not where.same_gpu
