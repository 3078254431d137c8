"""The run config's kernel choices (plain data: the run config's schema imports them without the kernels): which
kernel backend runs, and the fast-path switches a KernelPlan carries (top_rl/kernels/plan.py builds it)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class AttentionBackend(StrEnum):
    """SGLang's --attention-backend values a contract may allow (engine and trainer always agree)."""

    fa3 = "fa3"
    flashinfer = "flashinfer"
    triton = "triton"
    # The run config's: decided on the driver from the GPU it sees (top_rl/driver/backend_choice.py) before any check;
    # no contract allows it, so it never reaches an engine, a KernelPlan or a checkpoint.
    auto = "auto"


class KernelBackend(StrEnum):
    reference = "reference"  # torch made batch-invariant by fixed-shape tiling (CPU, any device)
    plain = "plain"  # stock torch's eager ops (any device)
    stock = "stock"  # the non-TOP baseline: fast stock kernels on CUDA (flash varlen, Liger norm), plain's elsewhere
    sglang = "sglang"  # SGLang's own Triton kernels (GPU)


class AttentionBackward(StrEnum):
    flash = "flash"  # aten's FlashAttention-2 varlen backward (bf16/fp16; other dtypes run efficient)
    efficient = "efficient"  # aten's memory-efficient kernels (K/V heads repeated)


@dataclass
class FastPaths:
    """top.fast_paths: the speed switches of the `sglang` backend and the native engine (bench/RESULTS.md measures
    each); each runs the same forward bits either way, and all but CHANGES_GRADIENTS' the same gradients too (A/B
    measurements). One class for the run config's group and the plan's switches: mutable, because Hydra merges
    overrides into it (it makes a frozen dataclass read-only); `build` gives every plan its own copy."""

    fused_forward: bool = True  # RMSNorm / SiLU-and-mul / token log-prob forwards as one Triton pass each
    fused_sampler: bool = True  # the sampler path's rounding inside the gather kernel (off: eager division, rounding)
    fused_head_mean: bool = True  # per-head RMSNorm mean of rows of 128 in one Triton pass (off: mean_BI)
    fused_backward: bool = True  # compiled / Triton elementwise backwards (off: eager formulas)
    # The flash backward reuses the forward kernel's LSE (off: re-runs FA2's forward for one). That LSE differs from
    # FA2's at bf16 level, so the gradients differ from the re-run's (~1e-3): a switch in CHANGES_GRADIENTS
    flashinfer_lse: bool = True  # the flash backward reads flashinfer's forward LSE (off: re-runs FA2's forward)
    fa3_lse: bool = True  # the flash backward reads fa3's forward LSE (off: re-runs FA2's forward)
    # the attention backward: flash (aten's FlashAttention-2) | efficient (memory-efficient)
    attention_backward: AttentionBackward = AttentionBackward.flash
    decode_graphs: bool = True  # the native engine's decode step as a CUDA graph where audited (off: eager)
    # With activation recompute (trainer.recompute): the recompute inside the backward runs FlashAttention-2's forward
    # instead of the engine's kernel and hands its LSE to the flash backward, which then re-runs no forward (sglang
    # backend, bf16). The gated forward keeps the engine's bits; the gradients become those of the flash forward's
    # activations (bf16 rounding apart), not bit for bit the default's: off until measured on a GPU.
    recompute_attention: bool = False
    # With activation recompute: the recompute inside the backward runs the linear layers' GEMMs on cuBLAS instead
    # of the engine's batch-invariant mm_BI (sglang backend). The gated forward keeps the engine's bits; the backward
    # then reads activations a cuBLAS GEMM made (bf16 rounding apart from mm_BI's), so the gradients are not bit for
    # bit the default's: off until measured on a GPU (bench/RESULTS.md session 17 profiles the gap it targets).
    recompute_gemm: bool = False
