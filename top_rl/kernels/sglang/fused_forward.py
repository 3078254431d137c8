"""The `sglang` backend's RMSNorm, SiLU-and-mul and token log-prob forwards: the engine's eager chains, or one
Triton pass each (log-probs: logprob_triton.py, lsm_BI's row reductions storing only the gathered column).

The engine runs the eager chains below (SGLang rl mode, forward_native); on CUDA the trainer runs the kernels of
top_rl/kernels/sglang/fused_triton.py instead, which give the same bits (that file says why; the GPU tests
compare bit patterns). Fewer passes over [tokens, hidden] fp32 tensors is all they change. Elsewhere (CPU, odd
dtypes or shapes), with top.fast_paths.fused_forward=false (A/B measurements), or once a Triton launch failed in
this process (after one warning, counted in kernels.report()), the eager chain runs: same bits, slower. Triton is
imported on first CUDA use.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from top_rl.kernels import fallback as _fallback
from top_rl.kernels import plan as _plan

_FLOATS = (torch.float32, torch.bfloat16, torch.float16)
_failed: dict[str, str] = {}  # op -> the first launch error, once it fell back to eager


def _run(name: str, fused, eager, *args):
    if not _plan.current().fast_paths.fused_forward:  # off: the eager chains (bench/trainer_step.py's "TOP before")
        _fallback.took(name, "off")
        return eager(*args)
    return _fallback.run(_failed, name, f"the fused {name} forward", "its eager chain", fused, eager, *args)


def _kernels():
    from top_rl.kernels.sglang import fused_triton

    return fused_triton


# ------------------------------------------------------------------------------------------------- RMSNorm
def rms_norm_eager(x, w, residual, eps, orig, mean, result=None):
    """RMSNorm.forward_native (fp32 weight, cast_x_before_out_mul, fp32 residual) with mean = mean_BI, as the
    engine runs it. Returns (out, new_residual or None, n, rstd, n_cast); the last three are what backward uses.
    `result`: out rounded to that dtype, as the engine's next GEMM rounds its input (None: w * n_cast's dtype)."""
    xf = x.contiguous().to(torch.float32)
    new_residual = None
    if residual is not None:
        xf = xf + residual.to(torch.float32)
        new_residual = xf.clone()
    rstd = torch.rsqrt(mean(xf.pow(2), -1, keepdim=True) + eps)
    n = xf * rstd
    n_cast = n.to(orig)
    out = w * n_cast
    return out if result is None else out.to(result), new_residual, n, rstd, n_cast


def _rms_norm_fusable(x, w, residual, orig) -> bool:
    return (x.is_cuda and w.is_cuda and x.numel() > 0 and x.dtype in _FLOATS and w.dtype in _FLOATS
            and orig in _FLOATS and w.dim() == 1 and w.shape[0] == x.shape[-1]
            and (residual is None or (residual.is_cuda and residual.dtype in _FLOATS and residual.shape == x.shape)))


def rms_norm(x, w, residual, eps, orig, mean, result=None):
    """rms_norm_eager's results, from the Triton kernels where they apply (module docstring)."""
    if not _rms_norm_fusable(x, w, residual, orig) or (result is not None and result not in _FLOATS):
        return rms_norm_eager(x, w, residual, eps, orig, mean, result)
    return _run("rms_norm", lambda *a: _kernels().rms_norm(*a), rms_norm_eager, x, w, residual, eps, orig, mean,
                result)


# -------------------------------------------------------------------------------------------- SiLU-and-mul
def silu_and_mul_eager(g):
    """SiluAndMul.forward_native: F.silu(g[..., :d]) * g[..., d:]."""
    d = g.shape[-1] // 2
    return F.silu(g[..., :d]) * g[..., d:]


def silu_and_mul(g):
    """silu_and_mul_eager's result, from the Triton kernel where it applies (module docstring)."""
    if not (g.is_cuda and g.dtype in _FLOATS and g.numel() > 0 and g.shape[-1] % 2 == 0):
        return silu_and_mul_eager(g)
    return _run("silu_and_mul", lambda *a: _kernels().silu_and_mul(*a), silu_and_mul_eager, g)


# ------------------------------------------------------------------------------------------ token log-probs
def token_logprobs_eager(z, ids, log_softmax):
    """What the engine computes: lsm_BI's whole [T, V] output, then the column of each row's id."""
    return log_softmax(z, dim=-1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)


def _gather_kernel():
    from top_rl.kernels.sglang import logprob_triton

    return logprob_triton


def token_logprobs(z, ids, log_softmax):
    """token_logprobs_eager's bits, from the gather kernel (no [T, V] output) where it applies: CUDA, lsm_BI's
    input dtypes (fp32 prefill path, bf16 sampler path), int64 ids, at least one row."""
    if not (z.is_cuda and ids.is_cuda and z.dtype in (torch.float32, torch.bfloat16) and ids.dtype == torch.int64
            and z.numel() > 0 and ids.shape == z.shape[:-1]):
        return token_logprobs_eager(z, ids, log_softmax)
    return _run("token_logprobs", lambda z, ids, _: _gather_kernel().gathered_log_softmax(z, ids),
                token_logprobs_eager, z, ids, log_softmax)


def _sampler_fusable(logits, ids, temperature) -> bool:
    """The kernel's loads must be lsm_BI's loads of _sampler_input's output (a fresh contiguous bf16 tensor): so 2-D
    contiguous bf16 logits whose data pointer is 16-byte aligned, as Triton specialises pointers."""
    t = temperature.reshape(-1)
    return (_plan.current().fast_paths.fused_sampler and logits.is_cuda and logits.dtype == torch.bfloat16
            and logits.dim() == 2 and logits.is_contiguous() and logits.data_ptr() % 16 == 0 and logits.numel() > 0
            and ids.is_cuda and ids.dtype == torch.int64 and ids.shape == logits.shape[:1] and t.is_cuda
            and t.dtype == torch.float32 and t.numel() == logits.shape[0])


def sampler_logprobs(logits, ids, temperature, eager):
    """(log-probs, shift or None) on the sampler path. `eager(logits, ids, temperature)`: lsm_BI over the rounded
    bf(f32(L) / T), gathered (what the engine computes). Where the fused kernel applies it gives the same bits in one
    pass over L, plus each row's max + log-sum-exp for the backward (backward.sampler_logprobs_grad)."""
    if not _sampler_fusable(logits, ids, temperature):
        return eager(logits, ids, temperature), None
    return _run("sampler_logprobs", lambda l, i, t: _gather_kernel().gathered_sampler_log_softmax(l, t, i),
                lambda l, i, t: (eager(l, i, t), None), logits, ids, temperature)
