"""Which pass of activation recompute a forward runs in: the layer's first forward, its recompute inside the backward,
or neither (no recompute). `top_rl.train.recompute` enters the pass around each checkpointed layer; a kernel reads it
(`current()`) where the recompute may take a faster forward than the gated one (top.fast_paths.recompute_attention,
top_rl.kernels.sglang.attention). Per thread: the recompute runs in the autograd engine's thread, synchronously inside
the backward, and a forward elsewhere (another thread) is in no pass."""

from __future__ import annotations

import contextlib
import threading

FIRST = "first"  # the checkpointed layer's forward (its saved tensors are dropped; only their shapes are kept)
RECOMPUTE = "recompute"  # the same layer run again inside the backward, for the tensors the backward reads

_local = threading.local()


def current() -> str | None:
    """FIRST, RECOMPUTE, or None outside a checkpointed layer."""
    return getattr(_local, "phase", None)


@contextlib.contextmanager
def scope(phase: str):
    previous = current()
    _local.phase = phase
    try:
        yield
    finally:
        _local.phase = previous
