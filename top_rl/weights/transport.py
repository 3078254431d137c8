"""Which transport carries the weights from trainer rank 0 to one engine, decided once when the trainer connects to it.

Every trainer rank takes part in gathering the full HF-named weights (TP all-gather, PP broadcast:
`Trainer.iter_hf_weights`); trainer rank 0 then sends one copy to each engine, by the transport its
placement allows:
  broadcast           a process group of rank 0 and that engine (NCCL between GPUs, gloo on CPU); one flat
                      uint8 buffer per bucket, the layout SGLang's FlattenedTensorBucket uses
  ipc                 an engine on rank 0's own GPU (NCCL cannot join two ranks on one device): CUDA IPC
                      handles of rank 0's buckets; the engine copies out before rank 0 frees them
  object_store        one `ray.put` of CPU tensors, shared by every such engine (CPU engines, or an SGLang engine
                      actor that writes them to disk or serialises them for its server: weight_sync=disk|tensor)
  sglang_distributed  SGLang's update_weights_from_distributed: the server's ranks join a group with rank 0
`cluster.weight_transport=auto` picks broadcast / ipc on GPUs and the object store on CPU; `broadcast`
forces process groups (gloo on CPU: the CI path), `object_store` forces the object store. SGLang servers take
weights their own way (rollout.sglang.weight_sync): `distributed` is sglang_distributed, disk and tensor go
through the object store to the engine actor.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class TransportSetting(StrEnum):
    """cluster.weight_transport: what the user allows (the config refuses anything else, naming these)."""

    auto = "auto"  # NCCL broadcast between GPUs, CUDA IPC on a shared GPU, the object store on CPU
    broadcast = "broadcast"  # a process group always (gloo on CPU)
    object_store = "object_store"


class Transport(StrEnum):
    """What one engine gets (module doc)."""

    broadcast = "broadcast"
    ipc = "ipc"
    object_store = "object_store"
    sglang_distributed = "sglang_distributed"


@dataclass(frozen=True)
class Endpoint:
    """Where a process computes: its node's address and its GPU's UUID (None on CPU)."""

    node: str
    gpu: str | None

    @classmethod
    def here(cls) -> "Endpoint":
        import ray

        gpu = None
        import torch  # here, not at import: the config (placement's TransportSetting) loads no torch

        if torch.cuda.is_available():
            gpu = str(torch.cuda.get_device_properties(torch.cuda.current_device()).uuid)
        return cls(ray.util.get_node_ip_address(), gpu)


@dataclass(frozen=True)
class Link:
    """How rank 0 reaches one engine, decided on the driver before connecting: the transport and, for a process
    group, its size (rank 0 + the engine's ranks), backend, and whether buckets travel as one flat buffer."""

    transport: Transport
    world: int = 2
    backend: str | None = None  # SGLang's group: nccl | gloo (the native group picks by device itself)
    flattened: bool = True

    @property
    def needs_group(self) -> bool:
        return self.transport in (Transport.broadcast, Transport.sglang_distributed)

    def group_name(self, index: int, port: int) -> str:
        """Unique per engine and connection: rank 0 holds one group per engine, a restart makes a new one."""
        kind = "sglang" if self.transport == Transport.sglang_distributed else "weights"
        return f"top_rl_{kind}_{index}_{port}"


def choose(setting: str, trainer: Endpoint, engine: Endpoint) -> Transport:
    """The transport for one native engine (see module doc)."""
    setting = TransportSetting(setting)  # refuses anything else, naming the choices
    same_gpu = trainer.gpu is not None and trainer.gpu == engine.gpu
    if setting == "object_store":
        return Transport.object_store
    if setting == "broadcast":
        if same_gpu:
            raise ValueError("cluster.weight_transport=broadcast, but a rollout engine shares trainer rank 0's GPU "
                             f"({engine.gpu}): NCCL cannot put two ranks on one device; use auto (CUDA IPC there)")
        if (trainer.gpu is None) != (engine.gpu is None):
            raise ValueError("cluster.weight_transport=broadcast needs the trainer and the engines on the same kind of "
                             "device (both GPU: NCCL, both CPU: gloo); use auto or object_store")
        return Transport.broadcast
    if trainer.gpu is None or engine.gpu is None:
        return Transport.object_store
    return Transport.ipc if same_gpu else Transport.broadcast


def link(setting: str, trainer: Endpoint, engine: Endpoint) -> Link:
    """A native engine's link (its process group, if any, is two ranks: rank 0 and the engine)."""
    return Link(choose(setting, trainer, engine))


def sglang_link(weight_sync: str, tp_size: int, flattened: bool, trainer: Endpoint) -> Link:
    """An SGLang engine's link, from its config (rollout.sglang): distributed joins the server's tp_size ranks to
    rank 0's group (NCCL if rank 0 has a GPU, else gloo); disk and tensor go through the engine actor."""
    if weight_sync != "distributed":
        return Link(Transport.object_store)
    return Link(Transport.sglang_distributed, 1 + tp_size, "nccl" if trainer.gpu else "gloo", flattened)
