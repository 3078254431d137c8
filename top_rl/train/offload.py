"""trainer.offload_during_rollout: the GPU optimizer's state parked in host memory between steps (top_rl.train.optim's
GpuAdamW.offload / onload), so that with cluster.gpu_handoff the SGLang server sharing the GPU can take most of it for
its KV pool while it generates. What moves: the fp32 master weights of compute-dtype parameters and every AdamW state
tensor (exp_avg, exp_avg_sq, step), copied to pinned host memory and back; Megatron DDP's fp32 gradient buffers (zero
between steps) are freed and re-allocated zeroed. What stays: the model's weights (the weight push reads them). No
tensor changes identity: only storages are released (`untyped_storage().resize_(0)`, as Megatron's own
DistributedDataParallel.offload_grad_buffers does) and restored, so the optimizer's state dicts, DDP's main_grad views
and every other reference stay valid. tests/train/test_optimizer_offload.py runs it on CPU tensors.
"""

from __future__ import annotations

import torch

HOST_CHUNK_BYTES = 1 << 30  # host copies are packed into pinned chunks of this size (HostCopies._new_hosts)
_ALIGN = 512  # bytes: each host copy starts aligned in its chunk


def _host_copies_for(tensors: list[torch.Tensor], pin: bool) -> list[torch.Tensor]:
    """Host tensors shaped like `tensors`, packed into chunks of up to HOST_CHUNK_BYTES (a larger tensor gets one of
    its own): torch's pinned allocator rounds every allocation up to a power of two, so one allocation a tensor could
    pin up to twice their bytes (~46 GB of state at 4B)."""
    chunks: list[int] = []  # bytes used per chunk
    where = []  # per tensor: (chunk, offset)
    for t in tensors:
        n = t.numel() * t.element_size()
        if n > HOST_CHUNK_BYTES:
            where.append((len(chunks), 0))
            chunks.append(-n)  # negative: a chunk of its own, closed
            continue
        if not chunks or chunks[-1] < 0 or chunks[-1] + n > HOST_CHUNK_BYTES:
            chunks.append(0)
        where.append((len(chunks) - 1, chunks[-1]))
        chunks[-1] += -(-n // _ALIGN) * _ALIGN
    buffers = [torch.empty(abs(used), dtype=torch.uint8, device="cpu", pin_memory=pin) for used in chunks]
    return [buffers[c][off: off + t.numel() * t.element_size()].view(t.dtype).view(t.shape)
            for t, (c, off) in zip(tensors, where)]


class HostCopies:
    """Tensors parked in host memory between steps without changing their identity (trainer.offload_during_rollout):
    each keeps its shape, dtype, device and every reference to it (the optimizer's state, DDP's main_grad views);
    only its storage is released (`untyped_storage().resize_(0)`) after a copy to a (pinned, for a CUDA tensor) host
    tensor, and restored (`resize_` back, then the copy) by `onload`. The host copies are kept and reused, so only the
    first offload of a tensor allocates its copy (packed: _host_copies_for). Device-agnostic: on the CPU the "device"
    storage is a CPU one."""

    def __init__(self):
        self.parked: list[tuple[torch.Tensor, torch.Tensor, int]] = []  # (tensor, its host copy, storage bytes)
        self._host: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # id(tensor) -> (tensor, host copy), reused

    def host_of(self, t: torch.Tensor) -> torch.Tensor | None:
        """The host copy of a parked tensor (its values while it is parked), None for one that is not parked."""
        kept = self._host.get(id(t))
        return kept[1] if self.parked and kept is not None and kept[0] is t else None

    @torch.no_grad()
    def offload(self, tensors) -> None:
        if self.parked:
            raise RuntimeError("top-rl: these tensors are offloaded already (HostCopies.offload twice)")
        seen, todo, fresh = set(), [], []
        for t in tensors:
            if id(t) in seen or t.numel() == 0:
                continue
            seen.add(id(t))
            nbytes = t.numel() * t.element_size()
            st = t.untyped_storage()
            if not t.is_contiguous() or t.storage_offset() != 0 or st.nbytes() != nbytes:
                raise ValueError(f"top-rl: cannot offload a tensor of shape {tuple(t.shape)} that is a view or does "
                                 f"not own its whole storage ({st.nbytes()} bytes for {nbytes})")
            kept = self._host.get(id(t))
            if kept is None or kept[0] is not t:
                fresh.append(t)
            todo.append((t, nbytes))
        for pin in (False, True):
            new = [t for t in fresh if t.is_cuda == pin]
            for t, host in zip(new, _host_copies_for(new, pin)):
                self._host[id(t)] = (t, host)
        todo = [(t, self._host[id(t)][1], nbytes) for t, nbytes in todo]
        for t, host, _ in todo:
            host.copy_(t, non_blocking=t.is_cuda)
        if any(t.is_cuda for t, _, _ in todo):
            torch.cuda.synchronize()  # the host copies are complete before the device storage goes
        for t, _, _ in todo:
            t.untyped_storage().resize_(0)
        self.parked = todo

    @torch.no_grad()
    def onload(self) -> None:
        for t, host, nbytes in self.parked:
            t.untyped_storage().resize_(nbytes)
            t.copy_(host, non_blocking=t.is_cuda)
        if any(t.is_cuda for t, _, _ in self.parked):
            torch.cuda.synchronize()
        self.parked = []


def release_grad_buffers(ddp) -> list[tuple[torch.Tensor, int]]:
    """Free Megatron DDP's fp32 gradient buffers (every param's main_grad is a view of one), keeping the tensors:
    what they hold is zero between steps (GpuAdamW.step and a halted step zero them), so nothing is copied. The
    bf16/fp32 weights are not in them (no distributed optimizer: DDP's buffers hold no param_data)."""
    released = []
    for buf in list(ddp.buffers) + list(getattr(ddp, "expert_parallel_buffers", [])):
        g = buf.grad_data
        if g is None or g.untyped_storage().nbytes() == 0:
            continue
        param_data = getattr(buf, "param_data", None)
        if param_data is not None and param_data.untyped_storage().data_ptr() == g.untyped_storage().data_ptr():
            raise ValueError("top-rl: this DDP buffer's weights share its gradient storage; it cannot be offloaded")
        released.append((g, g.untyped_storage().nbytes()))
        g.untyped_storage().resize_(0)
    return released


def restore_grad_buffers(released: list[tuple[torch.Tensor, int]]) -> None:
    for g, nbytes in released:
        g.untyped_storage().resize_(nbytes)
        g.zero_()


def refuse_offloaded(what: str) -> None:
    raise RuntimeError(f"top-rl: {what} with the optimizer state offloaded to host memory "
                       "(trainer.offload_during_rollout): call onload() first")

