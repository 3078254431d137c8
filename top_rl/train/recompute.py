"""Non-reentrant activation recompute for Megatron (the TOP default whenever recompute is on).

megatron-core 0.19.2 has no `use_reentrant` switch: full recompute (`recompute.checkpointed_forward`),
selective `core_attn` and selective `mlp` all call `megatron.core.tensor_parallel.checkpoint(fn,
distribute_saved_activations, *args)`, looked up on the package at call time, which is the reentrant
`CheckpointFunction` (nested backward; NaN gradients in public TOP runs; needs CUDA RNG state;
incompatible with `autograd.grad`). `install()` rebinds that name to `torch.utils.checkpoint` with
`use_reentrant=False` (docs/megatron.md §6.3). Megatron's RNG tracker is then not restored on recompute,
which is exact for TOP: dropout is 0 and every seam kernel is deterministic, so the recomputed forward
has the bits of the first one (tests/train/test_train_parity.py checks loss and grads with torch.equal), as long as
top.fast_paths.recompute_attention is off (the default).
`distribute_saved_activations` (saved-input split over TP) is not supported and is rejected.
Each checkpointed call marks its passes (top_rl.kernels.checkpoint_pass): with top.fast_paths.recompute_attention the
recompute's attention forward is FlashAttention-2's, not the engine's (the gated forward keeps the engine's bits; the
gradients are then those of the flash forward's activations: top_rl/kernels/sglang/attention.py).
"""

from __future__ import annotations

import torch.utils.checkpoint

from top_rl.kernels import checkpoint_pass

_installed = False


def non_reentrant_checkpoint(function, distribute_saved_activations, *args):
    """`function(*args)` checkpointed; its first call runs in checkpoint_pass FIRST, every later one (the recompute
    inside the backward) in RECOMPUTE, so a kernel can tell the gated forward from the recompute."""
    if distribute_saved_activations:
        raise ValueError("distribute_saved_activations is not supported by the TOP non-reentrant recompute")
    passes = iter((checkpoint_pass.FIRST,))

    def run(*inputs):
        with checkpoint_pass.scope(next(passes, checkpoint_pass.RECOMPUTE)):
            return function(*inputs)
    return torch.utils.checkpoint.checkpoint(run, *args, use_reentrant=False)


def install() -> None:
    """Idempotent; process-wide for megatron.core (TOP's rule: never the reentrant checkpoint)."""
    global _installed
    if _installed:
        return
    import megatron.core.tensor_parallel as tensor_parallel

    tensor_parallel.checkpoint = non_reentrant_checkpoint
    _installed = True
