"""Non-reentrant activation recompute for Megatron (the TOP default whenever recompute is on).

megatron-core 0.19.2 has no `use_reentrant` switch: full recompute (`recompute.checkpointed_forward`),
selective `core_attn` and selective `mlp` all call `megatron.core.tensor_parallel.checkpoint(fn,
distribute_saved_activations, *args)`, looked up on the package at call time, which is the reentrant
`CheckpointFunction` (nested backward; NaN gradients in public TOP runs; needs CUDA RNG state;
incompatible with `autograd.grad`). `install()` rebinds that name to `torch.utils.checkpoint` with
`use_reentrant=False` (docs/megatron.md §6.3). Megatron's RNG tracker is then not restored on recompute,
which is exact for TOP: dropout is 0 and every seam kernel is deterministic, so the recomputed forward
has the bits of the first one (tests/train/test_train_parity.py checks loss and grads with torch.equal).
`distribute_saved_activations` (saved-input split over TP) is not supported and is rejected.
"""

from __future__ import annotations

import torch.utils.checkpoint

_installed = False


def non_reentrant_checkpoint(function, distribute_saved_activations, *args):
    if distribute_saved_activations:
        raise ValueError("distribute_saved_activations is not supported by the TOP non-reentrant recompute")
    return torch.utils.checkpoint.checkpoint(function, *args, use_reentrant=False)


def install() -> None:
    """Idempotent; process-wide for megatron.core (TOP's rule: never the reentrant checkpoint)."""
    global _installed
    if _installed:
        return
    import megatron.core.tensor_parallel as tensor_parallel

    tensor_parallel.checkpoint = non_reentrant_checkpoint
    _installed = True
