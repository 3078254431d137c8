"""Which way the weights travel from trainer rank 0 to one engine: the one setting (`cluster.weight_transport`), and
the variant it picks for each engine, decided once when rank 0 connects to that engine (at start, after a restart).

Every trainer rank takes part in gathering the full HF-named weights (TP all-gather, PP broadcast:
`Trainer.iter_hf_weights`); rank 0 then sends one copy to each engine by its variant. Each variant is one class that
owns both ends (top_rl.weights.senders.TRANSPORTS is the table):

  variant             engine   where                         how
  ipc                 native   on rank 0's GPU               CUDA IPC handles of rank 0's flat buckets; the engine copies
  broadcast           native   other GPUs, or CPU (gloo)     a process group of rank 0 and the engine, one flat buffer
                                                             per bucket
  object_store        native   CPU                           one `ray.put` of CPU tensors shared by every such engine
  sglang_ipc          SGLang   its server on rank 0's GPU    CUDA IPC handles of flat buckets, serialised with SGLang's
                                                             own serializer on rank 0; the engine actor posts them to
                                                             the server's /update_weights_from_tensor (handles travel,
                                                             no tensor passes the object store or the driver)
  sglang_distributed  SGLang   other GPUs (NCCL; gloo on     the server's ranks join a group with rank 0 and receive
                               CPU)                          each bucket by /update_weights_from_distributed
  sglang_disk         SGLang   anywhere                      the engine actor writes an HF checkpoint next to its server
                                                             and the server reloads it (also how a restarted server gets
                                                             its weights back by itself)

`cluster.weight_transport` (the setting, one name for both kinds of engine):
  auto          the fastest the placement allows: ipc / sglang_ipc on rank 0's GPU, broadcast / sglang_distributed on
                other GPUs, the object store (native) or disk (SGLang) on CPU
  ipc           CUDA IPC; refused for an engine that does not share rank 0's GPU
  broadcast     a process group always (gloo on CPU: the CI path); refused for an engine on rank 0's GPU
  object_store  native engines only
  disk          SGLang servers only
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class TransportSetting(StrEnum):
    """cluster.weight_transport: what the user allows (the config refuses anything else, naming these)."""

    auto = "auto"
    ipc = "ipc"
    broadcast = "broadcast"
    object_store = "object_store"
    disk = "disk"


class Transport(StrEnum):
    """The variant one engine gets (module doc)."""

    ipc = "ipc"
    broadcast = "broadcast"
    object_store = "object_store"
    sglang_ipc = "sglang_ipc"
    sglang_distributed = "sglang_distributed"
    sglang_disk = "sglang_disk"


# What each kind of engine accepts of the setting (the rest is refused before start: `refusal`).
_ACCEPTS = {"native": {"auto", "ipc", "broadcast", "object_store"}, "sglang": {"auto", "ipc", "broadcast", "disk"}}


def refusal(setting: str, engine_kind: str) -> str | None:
    """Why `cluster.weight_transport=setting` cannot serve a `rollout.engine=engine_kind` engine, or None."""
    setting = TransportSetting(setting)
    if setting in _ACCEPTS[engine_kind]:
        return None
    return (f"cluster.weight_transport={setting} does not reach a {engine_kind} rollout engine; choose one of "
            f"{sorted(_ACCEPTS[engine_kind])}")


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
    """How rank 0 reaches one engine, decided on the driver before connecting: the variant, the engine's ranks (an
    SGLang server's tp_size; a native engine is one), the group backend (SGLang's group: nccl | gloo; a native group
    picks by device itself), and whether buckets travel as one flat buffer."""

    transport: Transport
    engine_ranks: int = 1
    backend: str | None = None
    flattened: bool = True

    @property
    def world(self) -> int:
        return 1 + self.engine_ranks

    @property
    def needs_group(self) -> bool:
        return self.transport in (Transport.broadcast, Transport.sglang_distributed)

    def group_name(self, index: int, port: int) -> str:
        """Unique per engine and connection: rank 0 holds one group per engine, a restart makes a new one."""
        kind = "sglang" if self.transport == Transport.sglang_distributed else "weights"
        return f"top_rl_{kind}_{index}_{port}"


def choose(setting: str, engine_kind: str, trainer: Endpoint, engine: Endpoint) -> Transport:
    """The variant for one engine (module doc): what `setting` allows where the two ends compute."""
    why = refusal(setting, engine_kind)
    if why:
        raise ValueError(why)
    setting = TransportSetting(setting)
    same_gpu = trainer.gpu is not None and trainer.gpu == engine.gpu
    on_gpus = trainer.gpu is not None and engine.gpu is not None
    sglang = engine_kind == "sglang"
    if setting == "ipc":
        if not same_gpu:
            raise ValueError(f"cluster.weight_transport=ipc, but a rollout engine ({engine.gpu or 'CPU'}) does not share "
                             f"trainer rank 0's GPU ({trainer.gpu or 'CPU'}): CUDA IPC needs one device; use auto")
        return Transport.sglang_ipc if sglang else Transport.ipc
    if setting == "broadcast":
        if same_gpu:
            raise ValueError("cluster.weight_transport=broadcast, but a rollout engine shares trainer rank 0's GPU "
                             f"({engine.gpu}): NCCL cannot put two ranks on one device; use auto (CUDA IPC there)")
        if (trainer.gpu is None) != (engine.gpu is None):
            raise ValueError("cluster.weight_transport=broadcast needs the trainer and the engines on the same kind of "
                             "device (both GPU: NCCL, both CPU: gloo); use auto or object_store")
        return Transport.sglang_distributed if sglang else Transport.broadcast
    if setting == "object_store":
        return Transport.object_store
    if setting == "disk":
        return Transport.sglang_disk
    if same_gpu:
        return Transport.sglang_ipc if sglang else Transport.ipc
    if on_gpus:
        return Transport.sglang_distributed if sglang else Transport.broadcast
    return Transport.sglang_disk if sglang else Transport.object_store


def link(setting: str, trainer: Endpoint, engine: Endpoint, sglang=None) -> Link:
    """One engine's link. `sglang`: its server config (top_rl.rollout.sglang.config.SglangEngineConfig), None for a
    native engine: an SGLang group holds rank 0 and the server's tp_size ranks, NCCL if rank 0 has a GPU, else gloo."""
    if sglang is None:
        return Link(choose(setting, "native", trainer, engine))
    return Link(choose(setting, "sglang", trainer, engine), sglang.tp_size, "nccl" if trainer.gpu else "gloo",
                bool(sglang.flattened_buckets))
