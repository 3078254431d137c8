"""Process groups for the trainer: torch.distributed init, Megatron's parallel state, rank layout.

Every trainer rank runs the same program (SPMD): a driver (the RL loop through Ray actors, or
`spawn` below for local runs and tests) calls the same Trainer method with the same arguments on
every rank. CPU uses gloo (with top_rl.train.cpu_shims); GPU uses NCCL. Megatron's rank order is
tp-cp-dp-pp (its default), so TP neighbours are adjacent ranks.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from megatron.core import parallel_state as ps


def init_process_group(rank: int = 0, world_size: int = 1, init_method: str | None = None, store=None) -> None:
    """Join (or create) the default group at `init_method` or `store` (top_rl.driver.rendezvous.store: bound to the node's
    address); a single process gets a private in-memory store (a file store was a /tmp/top_rl_pg_* file that no one
    removed: every run left one behind, outside its run_dir)."""
    if dist.is_initialized():
        return
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank % torch.cuda.device_count())))
    if store is not None:
        dist.init_process_group(backend, store=store, rank=rank, world_size=world_size)
        return
    if init_method is None:
        if world_size != 1:
            raise ValueError("init_method or store is required for world_size > 1")
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
        return
    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world_size)


@dataclass(frozen=True)
class Layout:
    tp: int
    pp: int
    cp: int
    dp: int
    tp_rank: int
    pp_rank: int
    cp_rank: int
    dp_rank: int

    @property
    def first_stage(self) -> bool:
        return self.pp_rank == 0

    @property
    def last_stage(self) -> bool:
        return self.pp_rank == self.pp - 1


def init_model_parallel(tp: int, pp: int, cp: int) -> Layout:
    """Megatron's parallel state for this layout (re-created if a different layout is active)."""
    world = dist.get_world_size()
    if world % (tp * pp * cp):
        raise ValueError(f"world size {world} is not a multiple of tp*pp*cp = {tp * pp * cp}")
    if ps.model_parallel_is_initialized():
        same = (ps.get_tensor_model_parallel_world_size(), ps.get_pipeline_model_parallel_world_size(),
                ps.get_context_parallel_world_size()) == (tp, pp, cp)
        if not same:
            ps.destroy_model_parallel()
    if not ps.model_parallel_is_initialized():
        ps.initialize_model_parallel(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
                                     context_parallel_size=cp)
    return Layout(tp, pp, cp, world // (tp * pp * cp), ps.get_tensor_model_parallel_rank(),
                  ps.get_pipeline_model_parallel_rank(), ps.get_context_parallel_rank(),
                  ps.get_data_parallel_rank())


def groups():
    """The process groups the trainer uses, read from Megatron's parallel state."""
    return {
        "tp": ps.get_tensor_model_parallel_group(),
        "pp": ps.get_pipeline_model_parallel_group(),
        "cp": ps.get_context_parallel_group(),
        "dp_cp": ps.get_data_parallel_group(with_context_parallel=True),
        "mp": ps.get_model_parallel_group(),
        "embedding": ps.get_embedding_group(check_initialized=False),
    }


def layer_offset(tc, pp_rank: int) -> int:
    """Global index of this stage's first layer for Megatron TransformerConfig `tc` (its even split)."""
    from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

    return get_transformer_layer_offset(tc, None, pp_rank)


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now, on `host` (local tools; a run's ranks meet through top_rl.driver.rendezvous)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _spawn_entry(rank, fn, world_size, init_method, args):
    init_process_group(rank, world_size, init_method)
    try:
        fn(rank, world_size, *args)
    finally:
        ps.destroy_model_parallel()
        dist.destroy_process_group()


def spawn(fn, world_size: int, *args) -> None:
    """Run `fn(rank, world_size, *args)` in `world_size` local processes joined in one process group
    (gloo on CPU): the local stand-in for the RL loop's Ray trainer actors. `fn` must be importable."""
    init_method = f"tcp://127.0.0.1:{free_port()}"
    mp.spawn(_spawn_entry, args=(fn, world_size, init_method, args), nprocs=world_size, join=True)
