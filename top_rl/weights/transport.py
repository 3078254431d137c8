"""Which way the weights travel from trainer rank 0 to one engine: the one setting (`cluster.weight_transport`), the
names of the variants, and the facts of a placement their rules read (`Placement`). Which variant an engine gets is
decided once when rank 0 connects to it (at start, after a restart) by the variants' own rules
(top_rl.weights.senders.choose). This module loads no torch: the config reads the setting and its refusals here.

Every trainer rank takes part in gathering the full HF-named weights (TP all-gather, PP broadcast:
`Trainer.iter_hf_weights`); rank 0 then sends one copy to each engine by its variant. Each variant is one class that
owns both ends and its rule (top_rl.weights.senders.TRANSPORTS is the table, fastest first):

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

from top_rl.config.cluster import TransportSetting  # noqa: F401 - also transport.TransportSetting


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
class Placement:
    """Where trainer rank 0 and one engine compute: what a variant's rule reads."""

    trainer: Endpoint
    engine: Endpoint

    @property
    def same_gpu(self) -> bool:
        return self.trainer.gpu is not None and self.trainer.gpu == self.engine.gpu

    @property
    def on_gpus(self) -> bool:
        return self.trainer.gpu is not None and self.engine.gpu is not None

    def ipc_refusal(self) -> str | None:
        """CUDA IPC needs one device."""
        if self.same_gpu:
            return None
        return (f"cluster.weight_transport=ipc, but a rollout engine ({self.engine.gpu or 'CPU'}) does not share "
                f"trainer rank 0's GPU ({self.trainer.gpu or 'CPU'}): CUDA IPC needs one device; use auto")

    def group_refusal(self) -> str | None:
        """A process group needs two devices of one kind."""
        if self.same_gpu:
            return ("cluster.weight_transport=broadcast, but a rollout engine shares trainer rank 0's GPU "
                    f"({self.engine.gpu}): NCCL cannot put two ranks on one device; use auto (CUDA IPC there)")
        if (self.trainer.gpu is None) != (self.engine.gpu is None):
            return ("cluster.weight_transport=broadcast needs the trainer and the engines on the same kind of "
                    "device (both GPU: NCCL, both CPU: gloo); use auto or object_store")
        return None


@dataclass(frozen=True)
class Link:
    """How rank 0 reaches one engine, decided on the driver before connecting: the variant, the engine's ranks (an
    SGLang server's tp_size; a native engine is one), the group backend (SGLang's group: nccl | gloo; a native group
    picks by device itself), whether buckets travel as one flat buffer, and the prefix of its process groups' names
    (an SGLang engine's rollout.sglang.weight_group_name)."""

    transport: Transport
    engine_ranks: int = 1
    backend: str | None = None
    flattened: bool = True
    group_prefix: str = "top_rl_weights"

    @property
    def world(self) -> int:
        return 1 + self.engine_ranks

    @property
    def needs_group(self) -> bool:
        return self.transport in (Transport.broadcast, Transport.sglang_distributed)

    def group_name(self, index: int, port: int) -> str:
        """Unique per engine and connection: rank 0 holds one group per engine, a restart makes a new one."""
        return f"{self.group_prefix}_{index}_{port}"
