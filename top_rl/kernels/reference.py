"""Reference backend: torch ops made batch-invariant, each with an analytic backward.

Forward formulas follow SGLang 0.5.11's `forward_native` paths in rl mode op for op (RMSNorm,
NeoX RoPE, SiLU-and-mul; tests compare them bitwise with the pinned wheel); GEMMs go through the
fixed-shape tiled product, attention through fixed-size key blocks (reference_attention.py).
Casts inside an op are differentiated as identities (straight-through), as autograd does for `.to()`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from top_rl.kernels.reference_attention import attention, decode_attention  # noqa: F401  (ops of this backend module)
from top_rl.kernels.tiled_gemm import acc_dtype, matmul_nt


class _Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, group):
        x2 = x.reshape(-1, x.shape[-1])
        out = matmul_nt(x2, w, group).to(x.dtype)
        ctx.save_for_backward(x2, w)
        ctx.x_shape = x.shape
        return out.reshape(*x.shape[:-1], w.shape[0])

    @staticmethod
    def backward(ctx, g):
        x2, w = ctx.saved_tensors
        acc = acc_dtype(x2.dtype)
        g2 = g.reshape(-1, g.shape[-1]).to(acc)
        gx = (g2 @ w.to(acc)).to(x2.dtype).reshape(ctx.x_shape)
        gw = (g2.T @ x2.to(acc)).to(w.dtype)
        return gx, gw, None


def linear(x, w):
    return _Linear.apply(x, w, None)


def row_linear(x, w, group=None):
    # The output is replicated across `group` (as after Megatron's all-reduce), so the incoming gradient
    # is already the full one on every rank: the local backward needs no communication.
    return _Linear.apply(x, w, group)


class _RMSNorm(torch.autograd.Function):
    """SGLang RMSNorm.forward_native with weight_dtype=fp32, cast_x_before_out_mul=True, fp32_residual=True."""

    @staticmethod
    def forward(ctx, x, w, residual, eps, out_dtype, result_dtype):
        orig = out_dtype or x.dtype
        acc = acc_dtype(x.dtype)
        xf = x.to(acc)
        if residual is not None:
            xf = xf + residual.to(acc)
        new_residual = xf.clone() if residual is not None else None
        rstd = torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps)
        n = xf * rstd
        out = w * n.to(orig)
        out = out if result_dtype is None else out.to(result_dtype)
        ctx.save_for_backward(n, rstd, w, n.to(orig))
        ctx.dtypes = (x.dtype, None if residual is None else residual.dtype)
        if residual is None:
            return out
        return out, new_residual

    @staticmethod
    def backward(ctx, g_out, g_res=None):
        n, rstd, w, n_cast = ctx.saved_tensors
        x_dtype, res_dtype = ctx.dtypes
        g_x, g_w, g_r = rms_norm_grads(g_out, g_res, n, rstd, w, n_cast, x_dtype, res_dtype)
        return g_x, g_w, g_r, None, None, None


def rms_norm_grads(g_out, g_res, n, rstd, w, n_cast, x_dtype, res_dtype):
    """(d x, d w, d residual or None) of _RMSNorm from its saved tensors (the sglang backend compiles this)."""
    acc = n.dtype
    g_out = g_out.to(acc)
    g_w = (g_out * n_cast.to(acc)).reshape(-1, n.shape[-1]).sum(0).to(w.dtype)
    g_n = g_out * w.to(acc)
    g_x = rstd * (g_n - n * (g_n * n).mean(dim=-1, keepdim=True))
    if g_res is not None:
        g_x = g_x + g_res.to(acc)
    return g_x.to(x_dtype), g_w, None if res_dtype is None else g_x.to(res_dtype)


def rms_norm(x, w, eps, residual=None, out_dtype=None, result_dtype=None):
    return _RMSNorm.apply(x, w, residual, eps, out_dtype, result_dtype)


def _cos_sin(positions, cos_sin, dtype):
    cos, sin = cos_sin.index_select(0, positions.flatten()).chunk(2, dim=-1)
    return cos.unsqueeze(-2).to(dtype), sin.unsqueeze(-2).to(dtype)


class _Rope(torch.autograd.Function):
    """NeoX rotary as SGLang's apply_rotary_emb: o1 = x1*cos - x2*sin, o2 = x2*cos + x1*sin."""

    @staticmethod
    def forward(ctx, x, positions, cos_sin):
        cos, sin = _cos_sin(positions, cos_sin, x.dtype)
        x1, x2 = torch.chunk(x, 2, dim=-1)
        ctx.save_for_backward(cos, sin)
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)

    @staticmethod
    def backward(ctx, g):
        cos, sin = ctx.saved_tensors
        return rope_grad(g, cos, sin), None, None


def rope_grad(g, cos, sin):
    """d x of the NeoX rotation: the rotation by -angle (the sglang backend compiles this)."""
    g1, g2 = torch.chunk(g, 2, dim=-1)
    return torch.cat((g1 * cos + g2 * sin, g2 * cos - g1 * sin), dim=-1)


def rope(x, positions, cos_sin):
    return _Rope.apply(x, positions, cos_sin)


class _SiluAndMul(torch.autograd.Function):
    @staticmethod
    def forward(ctx, g):
        d = g.shape[-1] // 2
        ctx.save_for_backward(g)
        return F.silu(g[..., :d]) * g[..., d:]

    @staticmethod
    def backward(ctx, go):
        (g,) = ctx.saved_tensors
        return silu_and_mul_grad(g, go)


def silu_and_mul_grad(g, go):
    """d g of silu(g[..., :I]) * g[..., I:] (the sglang backend compiles this)."""
    acc = acc_dtype(g.dtype)
    d = g.shape[-1] // 2
    a, b, go = g[..., :d].to(acc), g[..., d:].to(acc), go.to(acc)
    s = torch.sigmoid(a)
    grad_a = go * b * s * (1 + a * (1 - s))
    grad_b = go * a * s
    return torch.cat((grad_a, grad_b), dim=-1).to(g.dtype)


def silu_and_mul(g):
    return _SiluAndMul.apply(g)


def _log_softmax(logits, temperature):
    """(fp32 log-softmax over the vocab, dtype the engine returns it in) for the prefill path
    (temperature None) or the sampler path: log_softmax(c(f32(c(L)) / T)), stored in c = logits dtype."""
    acc = acc_dtype(logits.dtype)
    if temperature is None:
        return torch.log_softmax(logits.to(acc), dim=-1), acc
    z = (logits.to(acc) / temperature.to(acc).reshape(-1, 1)).to(logits.dtype).to(acc)
    return torch.log_softmax(z, dim=-1), logits.dtype


def sampler_log_softmax(logits, temperature):
    """The full-vocab distribution the engine samples from (§6.2), in the dtype it reports."""
    lp, out_dtype = _log_softmax(logits, _as_temperature(temperature, logits))
    return lp.to(out_dtype)


def _as_temperature(temperature, logits):
    if torch.is_tensor(temperature):
        return temperature.to(torch.float32)
    return torch.full((logits.shape[0],), float(temperature), dtype=torch.float32, device=logits.device)


class _TokenLogprobs(torch.autograd.Function):
    """log_softmax over the vocab gathered at `ids`; `temperature` None is the prefill path (§6.1),
    a tensor is the sampler path (§6.2) whose input and output are rounded to the logits' dtype."""

    @staticmethod
    def forward(ctx, logits, ids, temperature):
        lp, out_dtype = _log_softmax(logits, temperature)
        ctx.save_for_backward(lp, ids, temperature if temperature is not None else lp.new_ones(()))
        ctx.dtype = logits.dtype
        return lp.gather(-1, ids.unsqueeze(-1)).squeeze(-1).to(out_dtype)

    @staticmethod
    def backward(ctx, g):
        lp, ids, t = ctx.saved_tensors
        g = g.to(lp.dtype).unsqueeze(-1)
        grad = -lp.exp() * g
        grad.scatter_add_(-1, ids.unsqueeze(-1), g)
        return (grad / t.to(lp.dtype).reshape(-1, 1) if t.dim() else grad).to(ctx.dtype), None, None


def prefill_logprobs(logits, ids):
    return _TokenLogprobs.apply(logits, ids, None)


def sample_logprobs(logits, ids, temperature):
    return _TokenLogprobs.apply(logits, ids, _as_temperature(temperature, logits))
