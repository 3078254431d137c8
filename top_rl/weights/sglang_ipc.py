"""An SGLang server on trainer rank 0's GPU takes the weights by CUDA IPC (docs/numerics.md §9,
/update_weights_from_tensor): rank 0 flattens each bucket on its GPU into SGLang's FlattenedTensorBucket and
serialises it with SGLang's own MultiprocessingSerializer, which turns a CUDA tensor into an IPC handle; only those
strings travel (Ray, then HTTP from the engine's actor to its server), and the server's workers map rank 0's memory
and copy it into their parameters. Rank 0 keeps the buffers alive until the engine answers. The cost is one device
copy of the policy (the flatten) plus the server's load: the floor of a weight push on one GPU."""

from __future__ import annotations

import torch

from top_rl.engine.interface import EngineWeights
from top_rl.weights.base import Outgoing, Wait, WeightRequest, WeightTransport
from top_rl.weights.buckets import Bucket
from top_rl.weights.transport import Placement, Transport, TransportSetting


def tensor_payload(bucket: Bucket, tp_size: int, flattened: bool) -> tuple[list[str], str | None, list]:
    """(serialized_named_tensors, load_format, keep_alive) for POST /update_weights_from_tensor: one base64 entry per
    server TP rank, made with SGLang's own serializer (CUDA tensors become IPC handles); `keep_alive`: the tensors the
    handles point into, which the sender holds until the server has loaded them."""
    from sglang.srt.utils.common import MultiprocessingSerializer
    from sglang.srt.utils.patch_torch import monkey_patch_torch_reductions

    if any(t.is_cuda for _, t in bucket):
        monkey_patch_torch_reductions()  # CUDA devices by UUID, as the receiving worker expects
    if flattened:
        from sglang.srt.weight_sync.tensor_bucket import FlattenedTensorBucket

        b = FlattenedTensorBucket(named_tensors=[(n, t.detach().contiguous()) for n, t in bucket])
        flat = b.get_flattened_tensor()
        obj, fmt, keep = {"flattened_tensor": flat, "metadata": b.get_metadata()}, "flattened_bucket", [flat]
    else:
        named = [(n, t.detach().contiguous()) for n, t in bucket]
        obj, fmt, keep = named, None, [t for _, t in named]
    return [MultiprocessingSerializer.serialize(obj, output_str=True) for _ in range(tp_size)], fmt, keep


class SglangIpc(WeightTransport):
    """A server on rank 0's GPU: the serialised handles go to the engine, which posts them (load_ipc_buckets)."""

    kind, setting, engine_kind = Transport.sglang_ipc, TransportSetting.ipc, "sglang"

    @classmethod
    def refusal(cls, where: Placement) -> str | None:
        return where.ipc_refusal()

    @classmethod
    def auto_fits(cls, where: Placement) -> bool:
        return where.same_gpu

    def send(self, out: Outgoing, version: int) -> Wait:
        payloads, keep = [], []
        for bucket in out.buckets:
            serialized, fmt, alive = tensor_payload(bucket, self.link.engine_ranks, self.link.flattened)
            payloads.append((serialized, fmt))
            keep += alive
        if any(t.is_cuda for t in keep):
            torch.cuda.synchronize()  # the flat buffers are written before the server's workers read them
        ref = self.request(version, payloads)
        import ray

        def wait(keep=keep):  # rank 0's buffers live until the server has copied them into its parameters
            return ray.get(ref)
        return wait

    def receive(self, engine: EngineWeights, request: WeightRequest) -> int:
        engine.load_ipc_buckets(request.payload, request.version)
        return request.version
