"""The run config's cluster section: Ray, placement, weight transport, stop grace (plain data: top_rl/driver/placement.py
places by it)."""

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



@dataclass
class ClusterConfig:
    address: str | None = None  # None: RAY_ADDRESS if set, else a local Ray on this machine
    num_cpus: int | None = None  # local Ray only; None = all cores
    engine_cpus: float = 1.0  # CPUs Ray reserves per engine
    trainer_cpus: float = 1.0  # CPUs Ray reserves per trainer rank
    engine_gpus: float = 0.0  # per engine; fractional with colocate
    trainer_gpus: float = 0.0  # per trainer rank; fractional with colocate
    colocate: bool = False  # engines share the trainer ranks' GPUs (see module doc)
    weight_transport: TransportSetting = TransportSetting.auto  # how rank 0 sends weights (top_rl.weights)
    # One GPU shared in time, not only in space (colocated SGLang servers): each server gives back its weights, KV
    # pool and CUDA graphs while the trainer steps (SGLang's release/resume_memory_occupation, torch_memory_saver)
    # and the trainer empties its cache after the step, so the server's KV pool can take most of the GPU.
    gpu_handoff: bool = False
    placement_timeout_s: float = 60.0  # a placement Ray cannot satisfy fails after this, naming what is missing
    torch_threads: int = 0  # per actor; 0 = the machine's cores (rollout and training alternate)
    max_engine_restarts: int = 3  # rollout engines that die are replaced this many times per run
    # Samples per engine call: a step's rollout is sent in waves of this size per engine. 0: one call per engine,
    # the whole batch at once (an SGLang server then runs every sample concurrently; waves cap it at the wave's size).
    # Batch invariance makes the samples the same either way.
    rollout_chunk: int = 0
    # After the first SIGINT/SIGTERM/SIGHUP the step in progress may run this many seconds more to finish (and be
    # checkpointed); past it the step is abandoned (its rollout and training are redone on resume, bitwise) and the
    # run stops: a step of hours (rollout.n_samples=100000) must not outlast a scheduler's stop.
    stop_grace_s: float = 30.0
