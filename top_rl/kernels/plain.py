"""Plain backend: stock torch's eager ops with the same dtype policy and autograd's own backwards.

Per-sequence SDPA attention, unfused RMSNorm, a full-vocab fp32 log-softmax: what a trainer and an engine get when
each calls its framework's default ops. Its results depend on batch shape, so trainer and engine disagree. The
non-TOP baseline (`top.enabled=false`) runs the `stock` backend (stock.py), which is these ops on CPU (bit for bit)
and the fast stock kernels (varlen flash attention, Liger's RMSNorm, a chunked log-prob) on CUDA.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from top_rl.kernels import reference


def linear(x, w):
    return F.linear(x, w.to(x.dtype))


class _AllReduceSum(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        x = x.clone()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, g):
        return g, None


def row_linear(x, w, group=None):
    out = F.linear(x, w.to(x.dtype))
    if group is not None and dist.get_world_size(group) > 1:
        out = _AllReduceSum.apply(out, group)
    return out


def rms_norm(x, w, eps, residual=None, out_dtype=None, result_dtype=None):
    orig = out_dtype or x.dtype
    xf = x.float()
    if residual is not None:
        xf = xf + residual.float()
    out = w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(orig)
    out = out if result_dtype is None else out.to(result_dtype)
    return out if residual is None else (out, xf)


def _repeat_kv(t, group):
    return t.repeat_interleave(group, dim=1)


def attention(q, k, v, cu_seqlens, scale):
    outs = []
    b = cu_seqlens.tolist()
    group = q.shape[1] // k.shape[1]
    for s, e in zip(b[:-1], b[1:]):
        qs, ks, vs = (t[s:e].transpose(0, 1) for t in (q, _repeat_kv(k, group), _repeat_kv(v, group)))
        outs.append(F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, scale=scale).transpose(0, 1))
    return torch.cat(outs, 0)


@torch.no_grad()
def decode_attention(q, k_cache, v_cache, lengths, scale):
    group = q.shape[1] // k_cache.shape[2]
    out = torch.empty_like(q)
    for i, n in enumerate(lengths.tolist()):
        ks = _repeat_kv(k_cache[i, :n], group).transpose(0, 1)
        vs = _repeat_kv(v_cache[i, :n], group).transpose(0, 1)
        out[i] = F.scaled_dot_product_attention(q[i].unsqueeze(1), ks, vs, scale=scale).squeeze(1)
    return out


def prefill_logprobs(logits, ids):
    return torch.log_softmax(logits.float(), -1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)


def sampler_log_softmax(logits, temperature):
    t = temperature.reshape(-1, 1) if torch.is_tensor(temperature) else temperature
    return torch.log_softmax(logits.float() / t, -1).to(logits.dtype)


def sample_logprobs(logits, ids, temperature):
    return sampler_log_softmax(logits, temperature).gather(-1, ids.unsqueeze(-1)).squeeze(-1)


rope = reference.rope  # RoPE is elementwise: already invariant


def silu_and_mul(g):
    return F.silu(g[..., : g.shape[-1] // 2]) * g[..., g.shape[-1] // 2 :]
