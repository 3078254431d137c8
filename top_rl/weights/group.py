"""The process group rank 0 broadcasts one engine's weights over, outside torch's default group (the trainer's
ranks own that). The rendezvous store comes from the caller (top_rl.driver.rendezvous: rank 0 serves it on the
port it reserved on its node's address, the engine connects to it)."""

from __future__ import annotations

import datetime

import torch
import torch.distributed as dist

GROUP_TIMEOUT = datetime.timedelta(minutes=10)


class Group:
    """Rank 0 is the trainer's rank 0; NCCL between GPUs, gloo on CPU."""

    def __init__(self, store, rank: int, world: int, name: str):
        store = dist.PrefixStore(name, store)
        if torch.cuda.is_available():
            self.device = torch.device("cuda", torch.cuda.current_device())
            self.pg = dist.ProcessGroupNCCL(store, rank, world)
        else:
            self.device = torch.device("cpu")
            self.pg = dist.ProcessGroupGloo(store, rank, world, GROUP_TIMEOUT)
        self._store = store  # the master store lives as long as the group

    def broadcast(self, tensor: torch.Tensor) -> None:
        self.pg.broadcast(tensor, 0).wait()
        if tensor.is_cuda:
            torch.cuda.current_stream().synchronize()

    def abort(self) -> None:
        try:
            self.pg.abort()
        except Exception:  # noqa: BLE001 - a group whose peer died may refuse; it is dropped either way
            pass
