"""cluster.weight_transport's choices (plain data: the run config's schema imports it without the transports)."""

from __future__ import annotations

from enum import StrEnum


class TransportSetting(StrEnum):
    """cluster.weight_transport: what the user allows (the config refuses anything else, naming these)."""

    auto = "auto"
    ipc = "ipc"
    broadcast = "broadcast"
    object_store = "object_store"
    disk = "disk"
