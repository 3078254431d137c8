"""The `sglang` backend's elementwise backwards (RMSNorm, RoPE, SiLU-and-mul, log-softmax), each one compiled kernel.

The forwards give the engine's own eager ops' bits: they are the contract (RMSNorm and SiLU-and-mul run bitwise
equal Triton passes, fused_forward.py). Gradients need to be right, not bitwise anything, so the reference
backend's analytic formulas (top_rl/kernels/reference.py) run through `torch.compile` here: one pass over the
activations instead of ~10 eager kernels, each reading and writing a [tokens, hidden] fp32 tensor. Should compiling
fail in this process, that op's eager formula runs from then on, after one warning: same gradients, slower.
On CUDA two backwards are hand-written Triton passes instead, where Inductor's kernel was far from what its bytes
need: SiLU-and-mul's (swiglu_grad_triton.py) and the sampler log-softmax's (logprob_triton.py).
"""

from __future__ import annotations

import torch

from top_rl.kernels import fallback as _fallback
from top_rl.kernels import plan as _plan
from top_rl.kernels import reference as _ref
from top_rl.kernels.sglang import fused_forward as _fused_forward

_FLOATS = (torch.float32, torch.bfloat16, torch.float16)
_compiled: dict = {}
_failed: dict[str, str] = {}  # op -> the first compile/run error, once it fell back to eager


def _compiled_fn(name: str, eager):
    fn = _compiled.get(name)
    if fn is None:
        fn = _compiled[name] = torch.compile(eager, dynamic=True)
    return fn


def _run(name: str, eager, *args, fallback=None):
    """`eager` compiled (once per op), or `fallback` (default: `eager` itself) once compiling has failed."""
    slow = fallback or eager
    if not _plan.current().fast_paths.fused_backward:  # off: the eager formulas (A/B, bench/trainer_step.py)
        _fallback.took(name, "off")
        return slow(*args)
    return _fallback.run(_failed, name, f"torch.compile of the {name} backward", "its eager formula",
                         lambda *a: _compiled_fn(name, eager)(*a), slow, *args)


def rms_norm_grads(g_out, g_res, n, rstd, w, n_cast, x_dtype, res_dtype):
    return _run("rms_norm", _ref.rms_norm_grads, g_out, g_res, n, rstd, w, n_cast, x_dtype, res_dtype)


def rope_grad(g, cos, sin):
    return _run("rope", _ref.rope_grad, g, cos, sin)


def _silu_and_mul_grad_triton(g, go):
    from top_rl.kernels.sglang import swiglu_grad_triton

    return swiglu_grad_triton.silu_and_mul_grad(g, go)


def silu_and_mul_grad(g, go):
    """One Triton pass on CUDA (swiglu_grad_triton.py), else the compiled formula; the compiled formula also once
    that launch has failed in this process."""
    compiled = lambda g, go: _run("silu_and_mul", _ref.silu_and_mul_grad, g, go)  # noqa: E731
    if not (g.is_cuda and go.is_cuda and g.dtype in _FLOATS and go.dtype == g.dtype and g.numel() > 0
            and g.shape[-1] % 2 == 0 and go.shape == (*g.shape[:-1], g.shape[-1] // 2)) \
            or not _plan.current().fast_paths.fused_backward:
        return compiled(g, go)
    return _fallback.run(_failed, "silu_and_mul_triton", "the Triton SiLU-and-mul backward", "its compiled formula",
                         _silu_and_mul_grad_triton, compiled, g, go)


def _token_logprobs_grad_onehot(z, ids, temperature, g):
    """d/d logits of g * log_softmax(z)[ids], z = logits (prefill) or bf(L / T) (sampler), given z:
    (onehot - softmax(z)) * g / T. Pointwise after the row reductions, so it compiles to one pass."""
    acc = torch.promote_types(z.dtype, torch.float32)  # fp32 for bf16 logits (fp64 stays, for tests)
    scale = g.to(acc).unsqueeze(-1)
    if temperature is not None:
        scale = scale / temperature.to(acc).reshape(-1, 1)
    p = torch.softmax(z.to(acc), dim=-1)
    hit = torch.arange(z.shape[-1], device=z.device) == ids.unsqueeze(-1)
    return ((hit.to(p.dtype) - p) * scale).to(z.dtype)


def _token_logprobs_grad_scatter(z, ids, temperature, g):
    """The same gradient with fewer [rows, vocab] temporaries for eager execution."""
    acc = torch.promote_types(z.dtype, torch.float32)
    scale = g.to(acc).unsqueeze(-1)
    if temperature is not None:
        scale = scale / temperature.to(acc).reshape(-1, 1)
    grad = torch.softmax(z, dim=-1, dtype=acc).mul_(-scale)
    grad.scatter_add_(-1, ids.unsqueeze(-1), scale)
    return grad.to(z.dtype)


def token_logprobs_grad(logits, ids, temperature, g):
    # The sampler's input bf(L / T) is rounded eagerly, outside the compiled kernel: Inductor folds a
    # downcast followed by an upcast and would skip that rounding (measured on the H200: 1.1% gradient error
    # at T=0.7 against the fp64 reference, tests/gpu/test_grads.py).
    z = logits if temperature is None else logits.div(temperature.reshape(-1, 1)).to(logits.dtype)
    return _run("token_logprobs", _token_logprobs_grad_onehot, z, ids, temperature, g,
                fallback=_token_logprobs_grad_scatter)


def sampler_logprobs_grad(logits, ids, temperature, shift, g):
    """token_logprobs_grad on the sampler path, given the fused forward's per-row shift: one Triton pass over the
    logits (logprob_triton._sampler_log_softmax_grad) instead of the eager division, rounding and the
    compiled softmax's passes; the compiled formula once that launch has failed in this process."""
    def fused(logits, ids, temperature, shift, g):
        from top_rl.kernels.sglang import logprob_triton

        return logprob_triton.sampler_log_softmax_grad(logits, temperature, ids, shift, g)

    return _fallback.run(_failed, "sampler_logprobs_fused", "the fused sampler log-prob backward", "its compiled formula",
                         fused, lambda l, i, t, _s, g: token_logprobs_grad(l, i, t, g), logits, ids, temperature, shift, g)


class SiluAndMul(_ref._SiluAndMul):
    """SGLang's native forward (the reference's, bitwise: tests/kernels/test_sglang_native_ops.py; on CUDA one Triton pass
    with the same bits, fused_forward.py), fused backward."""

    @staticmethod
    def forward(ctx, g):
        ctx.save_for_backward(g)
        return _fused_forward.silu_and_mul(g)

    @staticmethod
    def backward(ctx, go):
        (g,) = ctx.saved_tensors
        return silu_and_mul_grad(g, go)


def silu_and_mul(g):
    return SiluAndMul.apply(g)
