"""The contract's dtype policy as torch dtypes (top_rl/contract.py holds the contract as plain data)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class DtypePolicy:
    """The dtype at every cast of the forward (contract qwen3_dense_top_v1). `compute` is the model dtype (bf16 in production,
    fp32 allowed for tests): GEMM inputs/outputs, attention, SiLU-mul, KV cache and logits live in it."""

    compute: torch.dtype
    embedding: torch.dtype = torch.float32  # §3: embed_tokens is fp32 in rl mode
    norm_weight: torch.dtype = torch.float32  # §3: every RMSNorm weight (q/k norm too) is fp32
    residual: torch.dtype = torch.float32  # §4.2: fp32_residual=True, x = f32(sublayer_out) + r
    norm_output: torch.dtype = torch.float32  # §4.2: override_orig_dtype=fp32 -> input/post/final norm out fp32
    rope: torch.dtype = torch.float32  # §4.5: q/k leave q_norm/k_norm in fp32, RoPE runs and caches in fp32
    prefill_logprob: torch.dtype = torch.float32  # §6.1: fp32 log-softmax of f32(logits), no temperature

    @property
    def sample_logprob(self) -> torch.dtype:
        """§6.2: the sampler's log-probs are log_softmax(bf(f32(bf(L))/T)) stored in the compute dtype."""
        return self.compute

    @property
    def linear_weight(self) -> torch.dtype:
        return self.compute

    @property
    def kv_cache(self) -> torch.dtype:
        return self.compute  # §3: --kv-cache-dtype auto == model dtype


_DTYPES = {"bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float32": torch.float32, "fp32": torch.float32,
           "float64": torch.float64}
DTYPE_NAMES = tuple(_DTYPES)  # what a command's dtype option accepts


def as_dtype(d: torch.dtype | str) -> torch.dtype:
    if isinstance(d, torch.dtype):
        return d
    try:
        return _DTYPES[d]
    except KeyError:
        raise ValueError(f"unknown dtype {d!r}; use one of {sorted(_DTYPES)}") from None


