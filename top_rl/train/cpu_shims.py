"""The only place where Megatron-core is adapted to run without CUDA (gloo on CPU).

megatron-core 0.19.2 assumes a GPU at a few call sites that the TOP trainer reaches even though its
own layers (top_rl.train.layers) never touch CUDA. `apply()` patches those sites at runtime, and only
when `torch.cuda.is_available()` is False; on a GPU it does nothing. Installed files are never edited.
Each shim names the site it serves (docs/megatron.md §2.1-2.2):

1. `torch.cuda.current_device()` returns "cpu". `RotaryEmbedding.get_emb` moves `inv_freq` to
   `torch.cuda.current_device()` on its first call, even with `use_cpu_initialization=True` (§2.1 #3):
   reached with `TrainerConfig(megatron_rope=True)` (the default seam RoPE builds no Megatron rotary
   table and ran without any shim); the other `device=torch.cuda.current_device()` sites Megatron may
   reach (buffers, gathers) then allocate on CPU too.

Deliberately absent: the RNG-state shims of §2.2 (#1, #2, #6). They are only reached by Megatron's
reentrant `CheckpointFunction`, its RNG tracker (dropout under sequence parallelism) and
`model_parallel_cuda_manual_seed`; the trainer uses none of them (non-reentrant recompute,
top_rl.train.recompute; dropout 0; no sequence parallelism; weights never initialised by Megatron).

Not shimmed, because the trainer does not use them on CPU: the local `DotProductAttention` (replaced
by the seam's attention), Megatron's optimizer, DDP and pipeline schedules (§2.3: CUDA tensor types;
the CPU path uses torch AdamW and explicit send/recv, top_rl.train.optim / schedule).
"""

from __future__ import annotations

import torch

_applied = False


def needed() -> bool:
    return not torch.cuda.is_available()


def apply() -> bool:
    """Install the shims if CUDA is absent (idempotent). Returns whether they are active."""
    global _applied
    if _applied or not needed():
        return _applied
    torch.cuda.current_device = lambda: "cpu"  # shim 1
    _applied = True
    return True
