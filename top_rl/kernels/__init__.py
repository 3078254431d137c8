"""The kernel seam: every op that touches a log-prob goes through these functions.

A backend implements the ops; one is active per process, named by the process's `KernelPlan` (plan.py), which
`install(plan)` sets once at start from the run config; `report()` says which path each op took. `reference` is
torch made batch-invariant by fixed-shape tiling (CPU, any device), `plain` is stock torch's eager ops (per-sequence
SDPA, unfused norms, a full-vocab log-softmax), `stock` is the non-TOP baseline (`top.enabled=false`): on CUDA the
fast kernels a verl/slime trainer runs (varlen flash attention, Liger's RMSNorm, a chunked log-prob), elsewhere
plain's ops, bit for bit (stock.py), and `sglang` (GPU, the sglang/ package) wraps SGLang's own Triton kernels. Callers never import a backend directly, so
a new backend plugs in without touching the model or the trainer.

Op semantics (shapes use T tokens, H hidden, heads Hq / Hkv of size d):
  linear(x[..., K], w[N, K]) -> [..., N] in x.dtype      column-parallel or replicated GEMM
  row_linear(x, w, group)    -> same, K split over `group` ranks, TP-invariant reduction
  rms_norm(x, w, eps, residual=None, out_dtype=None, result_dtype=None) -> out  (or (out, new_residual) with a
      residual); out = w * n rounded to out_dtype (default x.dtype), in result_dtype if given (the dtype the next
      GEMM rounds its input to: the same bits, without a separate cast pass)
  rope(x[T, h, d], positions[T], cos_sin[P, d]) -> [T, h, d]    NeoX, in x.dtype
  silu_and_mul(g[..., 2I]) -> [..., I]
  attention(q[T, Hq, d], k[T, Hkv, d], v, cu_seqlens[S+1], scale) -> [T, Hq, d]   causal, per sequence
  decode_attention(q[B, Hq, d], k_cache[B, L, Hkv, d], v_cache, lengths[B], scale) -> [B, Hq, d]
      (the query of row b sits at position lengths[b]-1 and attends keys [0, lengths[b]))
  prefill_logprobs(logits[T, V], ids[T]) -> fp32: log_softmax(f32(logits))[ids]
  sample_logprobs(logits[T, V], ids[T], temperature) -> compute dtype: log_softmax(c(f32(c(L))/T))[ids]
  sampler_log_softmax(logits, temperature) -> [T, V], the distribution sample_logprobs gathers from
"""

from __future__ import annotations

import contextlib
import importlib
from typing import Any

from top_rl.kernels import fallback as _fallback
from top_rl.kernels import plan as _plan
from top_rl.config.kernels import KernelBackend


_BACKEND_MODULES = {KernelBackend.reference: "top_rl.kernels.reference", KernelBackend.plain: "top_rl.kernels.plain",
                    KernelBackend.stock: "top_rl.kernels.stock", KernelBackend.sglang: "top_rl.kernels.sglang.backend"}
_active: Any = None


def available_backends() -> list[str]:
    return sorted(_BACKEND_MODULES)


def install(plan: _plan.KernelPlan) -> None:
    """The one call a process makes before its first kernel: `plan` decides every op from now on (its backend,
    contract, attention kernel, fast paths; top_rl/kernels/plan.py)."""
    global _active
    if plan.backend not in _BACKEND_MODULES:
        raise ValueError(f"unknown kernel backend {plan.backend!r}; choose one of {available_backends()}")
    module = importlib.import_module(_BACKEND_MODULES[plan.backend])  # a backend module defines every op below
    check = getattr(module, "check_plan", None)
    if check is not None:
        check(plan)  # e.g. sglang: its GEMM path is fixed once its kernels are loaded
    _plan.set_current(plan)
    _active = module


def current_plan() -> _plan.KernelPlan:
    """The plan this process computes under."""
    _b()
    return _plan.current()


def report() -> dict:
    """This process's kernel record: the plan, the path each op last took, and every fallback (op -> first error)."""
    return {**current_plan().as_dict(), "paths": dict(_fallback.paths), "fallbacks": dict(_fallback.fallbacks)}


def step_metrics(reports: list[dict]) -> dict:
    """Step metrics from every process's report: `kernels/fallbacks`, the fast paths that fell back to their slower
    equal, summed over processes (0 when every op ran the path its plan names)."""
    return {"kernels/fallbacks": sum(len(r["fallbacks"]) for r in reports)}


@contextlib.contextmanager
def use_plan(new: _plan.KernelPlan):
    """Temporarily compute under another plan (tests, benches, the baseline comparison)."""
    prev = _plan.current() if _active is not None else None
    install(new)
    try:
        yield
    finally:
        if prev is None:
            globals().update(_active=None)
            _plan.set_current(None)
        else:
            install(prev)


def backend_name() -> str:
    return current_plan().backend


def _b():
    if _active is None:
        install(_plan.current())
    return _active


def linear(x, w):
    return _b().linear(x, w)


def row_linear(x, w, group=None):
    return _b().row_linear(x, w, group)


def rms_norm(x, w, eps, residual=None, out_dtype=None, result_dtype=None):
    return _b().rms_norm(x, w, eps, residual, out_dtype, result_dtype)


def rope(x, positions, cos_sin):
    return _b().rope(x, positions, cos_sin)


def silu_and_mul(g):
    return _b().silu_and_mul(g)


def attention(q, k, v, cu_seqlens, scale):
    return _b().attention(q, k, v, cu_seqlens, scale)


def decode_attention(q, k_cache, v_cache, lengths, scale):
    return _b().decode_attention(q, k_cache, v_cache, lengths, scale)


def prefill_logprobs(logits, ids):
    return _b().prefill_logprobs(logits, ids)


def sample_logprobs(logits, ids, temperature):
    return _b().sample_logprobs(logits, ids, temperature)


def sampler_log_softmax(logits, temperature):
    """Full-vocab [T, V] version of sample_logprobs, for the engine's sampler (no autograd)."""
    return _b().sampler_log_softmax(logits, temperature)


def rope_cache(head_dim: int, base: float, max_positions: int, device=None):
    """SGLang rl-mode cos/sin cache (§4.5): inv_freq on CPU with the HF formula, then positions, their
    product and cos/sin on the target device (as SGLang does on CUDA), all fp32."""
    import torch

    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))
    inv_freq = inv_freq.to(device) if device is not None else inv_freq
    t = torch.arange(max_positions, dtype=torch.float, device=inv_freq.device)
    freqs = torch.einsum("i,j -> ij", t, inv_freq)
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1)
