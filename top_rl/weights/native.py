"""The variants that reach a native engine (top_rl.rollout.native.engine), and SGLang's disk reload, which travels the same
way: each engine receives the weights of one version whole and loads them with `engine.update_weights`."""

from __future__ import annotations

import functools

import torch

from top_rl.weights.base import Outgoing, Wait, WeightTransport
from top_rl.weights.buckets import flatten, meta_bytes, unflatten
from top_rl.weights.group import GROUP_TIMEOUT, Group
from top_rl.weights.transport import Link, Transport


def _ray():
    import ray

    return ray


class ObjectStore(WeightTransport):
    """One `ray.put` of CPU tensors, shared by every object-store engine of a push."""

    kind = Transport.object_store

    def send(self, out: Outgoing, version: int) -> Wait:
        ref = self.engine.receive_weights.remote(self.kind, out.object_ref(), version)
        return functools.partial(_ray().get, ref)

    @staticmethod
    def receive(actor, payload, version: int) -> None:
        actor.engine.update_weights(payload)


class SglangDisk(ObjectStore):
    """An SGLang server's reload from disk: the engine actor writes the tensors as an HF checkpoint next to its
    server, which loads it by POST /update_weights_from_disk (SglangEngine.update_weights). The slowest way, and the
    one a restarted server replays by itself."""

    kind = Transport.sglang_disk

    @staticmethod
    def receive(actor, payload, version: int) -> None:
        actor.engine.update_weights(payload, version=version)  # the trainer's number, which samples must carry


class Broadcast(WeightTransport):
    """A process group of rank 0 and the engine (NCCL between GPUs, gloo on CPU): one flat uint8 buffer per bucket,
    the metadata first by Ray so the engine can allocate."""

    kind = Transport.broadcast

    def send(self, out: Outgoing, version: int) -> Wait:
        ref = self.engine.receive_weights.remote(self.kind, out.metas, version)
        for b in out.buckets:
            self.group.broadcast(flatten(b).to(self.group.device))
        return functools.partial(_ray().get, ref)

    def close(self) -> None:
        self.group.abort()

    @staticmethod
    def join(actor, link: Link, name: str, host: str, port: int, store) -> None:
        actor.group = Group(store(link.world, 1, GROUP_TIMEOUT), 1, link.world, name)

    @staticmethod
    def receive(actor, payload, version: int) -> None:
        out: dict[str, torch.Tensor] = {}
        for meta in payload:
            buf = torch.empty(meta_bytes(meta), dtype=torch.uint8, device=actor.group.device)
            actor.group.broadcast(buf)
            out.update(unflatten(buf, meta))
        actor.engine.update_weights(out)


class Ipc(WeightTransport):
    """An engine on rank 0's GPU (NCCL cannot join two ranks on one device): CUDA IPC handles of rank 0's flat
    buckets; the engine copies out before rank 0 lets them go."""

    kind = Transport.ipc

    def send(self, out: Outgoing, version: int) -> Wait:
        from torch.multiprocessing.reductions import reduce_tensor

        bufs = out.flat_on_device()
        ref = self.engine.receive_weights.remote(self.kind, ([reduce_tensor(b) for b in bufs], out.metas), version)

        def wait(bufs=bufs):  # rank 0 keeps its buffers until the engine has copied them out
            return _ray().get(ref)
        return wait

    @staticmethod
    def receive(actor, payload, version: int) -> None:
        handles, metas = payload
        out: dict[str, torch.Tensor] = {}
        for (rebuild, args), meta in zip(handles, metas):
            buf = rebuild(*args)
            out.update({n: t.clone() for n, t in unflatten(buf, meta)})  # own copies: rank 0 frees its buffers
            del buf
        torch.cuda.synchronize()
        actor.engine.update_weights(out)
