"""The variants that reach a native engine (top_rl.rollout.native), and SGLang's disk reload, which travels the same
way: each engine receives the weights of one version whole and loads them with its `load_named_tensors` (the weight
protocol, top_rl.engine.interface.EngineWeights)."""

from __future__ import annotations

import functools

import torch

from top_rl.engine.interface import EngineWeights
from top_rl.weights.base import (GroupTransport, Outgoing, SameGpuTransport, Wait, WeightRequest, WeightTransport,
                                 object_store_named)
from top_rl.weights.buckets import flatten, meta_bytes, unflatten
from top_rl.weights.group import GROUP_TIMEOUT, Group
from top_rl.weights.transport import Link, Transport, TransportSetting


def _ray():
    import ray

    return ray


class Ipc(SameGpuTransport):
    """An engine on rank 0's GPU (NCCL cannot join two ranks on one device): CUDA IPC handles of rank 0's flat
    buckets; the engine copies out before rank 0 lets them go."""

    kind, setting, engine_kind = Transport.ipc, TransportSetting.ipc, "native"

    def send(self, out: Outgoing, version: int) -> Wait:
        from torch.multiprocessing.reductions import reduce_tensor

        bufs = out.flat_on_device()
        ref = self.request(version, ([reduce_tensor(b) for b in bufs], out.metas))

        def wait(bufs=bufs):  # rank 0 keeps its buffers until the engine has copied them out
            return _ray().get(ref)
        return wait

    def receive(self, engine: EngineWeights, request: WeightRequest) -> int:
        handles, metas = request.payload
        out: dict[str, torch.Tensor] = {}
        for (rebuild, args), meta in zip(handles, metas):
            buf = rebuild(*args)
            out.update({n: t.clone() for n, t in unflatten(buf, meta)})  # own copies: rank 0 frees its buffers
            del buf
        torch.cuda.synchronize()
        engine.load_named_tensors(out, request.version)
        return request.version


class Broadcast(GroupTransport):
    """A process group of rank 0 and the engine (NCCL between GPUs, gloo on CPU): one flat uint8 buffer per bucket,
    the metadata first by Ray so the engine can allocate. Each end holds its own Group."""

    kind, setting, engine_kind = Transport.broadcast, TransportSetting.broadcast, "native"

    @classmethod
    def connect(cls, link: Link, engine, store=None, host=None, port=None, name=None) -> "Broadcast":
        return cls(engine, link, Group(store(link.world, GROUP_TIMEOUT), 0, link.world, name))

    def send(self, out: Outgoing, version: int) -> Wait:
        ref = self.request(version, out.metas)
        for b in out.buckets:
            self.group.broadcast(flatten(b).to(self.group.device))
        return functools.partial(_ray().get, ref)

    def close(self) -> None:
        self.group.abort()

    @classmethod
    def join(cls, link: Link, engine: EngineWeights, name=None, host=None, port=None, store=None) -> "Broadcast":
        return cls(None, link, Group(store(link.world, 1, GROUP_TIMEOUT), 1, link.world, name))

    def receive(self, engine: EngineWeights, request: WeightRequest) -> int:
        out: dict[str, torch.Tensor] = {}
        for meta in request.payload:
            buf = torch.empty(meta_bytes(meta), dtype=torch.uint8, device=self.group.device)
            self.group.broadcast(buf)
            out.update(unflatten(buf, meta))
        engine.load_named_tensors(out, request.version)
        return request.version


class ObjectStore(WeightTransport):
    """One `ray.put` of CPU tensors, shared by every object-store engine of a push: the native engine anywhere."""

    kind, setting, engine_kind = Transport.object_store, TransportSetting.object_store, "native"

    def send(self, out: Outgoing, version: int) -> Wait:
        return functools.partial(_ray().get, self.request(version, out.object_ref()))

    def receive(self, engine: EngineWeights, request: WeightRequest) -> int:
        # the payload is the object store's reference (Ray resolves only a call's own arguments, not one inside the
        # request); the version is the trainer's number, which samples must carry (an SGLang engine would number a
        # version itself otherwise)
        engine.load_named_tensors(object_store_named(_ray().get(request.payload)), request.version)
        return request.version


class SglangDisk(ObjectStore):
    """An SGLang server's reload from disk: the engine actor writes the tensors as an HF checkpoint next to its
    server, which loads it by POST /update_weights_from_disk (SglangEngine.load_named_tensors). The slowest way, and
    the one a restarted server replays by itself."""

    kind, setting, engine_kind = Transport.sglang_disk, TransportSetting.disk, "sglang"
