"""Reference causal GQA attention: online softmax over fixed key blocks, so prefill, packed prefill and
decode give a query row the same bits.

A row at position t visits key blocks 0..t//B; blocks past it are fully masked and are exact no-ops
(max unchanged, exp(0) = 1 rescale, zero probabilities), so it does not matter whether a call sees the
rest of the sequence (prefill) or only the cache up to t (decode). Every GEMM has fixed shapes
(rows padded to the row tile, key blocks of `attn_kv_block`). The backward is the analytic
softmax-attention gradient, computed per sequence.
"""

from __future__ import annotations

import torch

from top_rl.kernels.tiled_gemm import TILING, _pad_to, acc_dtype


def _attend(q_rows, pos, k, v, n_keys, scale):
    """q_rows[R, d] at positions pos[R] over keys k/v[L, d] (the first n_keys valid). Returns (out, lse)."""
    blk = TILING.attn_kv_block
    r = q_rows.shape[0]
    q = _pad_to(q_rows, 0, TILING.row_tile)
    p_pos = torch.cat([pos, pos.new_full((q.shape[0] - r,), n_keys - 1)])
    k = _pad_to(k, 0, blk)
    v = _pad_to(v, 0, blk)
    m = q.new_full((q.shape[0], 1), float("-inf"))
    l = q.new_zeros((q.shape[0], 1))
    acc = q.new_zeros(q.shape)
    last_block = int(p_pos.max()) // blk
    for b in range(last_block + 1):
        kb, vb = k[b * blk : (b + 1) * blk], v[b * blk : (b + 1) * blk]
        key_idx = torch.arange(b * blk, (b + 1) * blk, device=q.device)
        s = (q @ kb.T) * scale
        s = s.masked_fill((key_idx[None, :] > p_pos[:, None]) | (key_idx[None, :] >= n_keys), float("-inf"))
        m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))
        alpha = torch.exp(m - m_new)
        p = torch.exp(s - m_new)
        l = l * alpha + p.sum(dim=-1, keepdim=True)
        acc = acc * alpha + p @ vb
        m = m_new
    return (acc / l)[:r], (m + torch.log(l))[:r, 0]


def _seq_attention(q, k, v, pos, n_keys, scale):
    """q[R, Hq, d] rows at positions pos[R] of one sequence; k/v[L, Hkv, d]. Returns out[R, Hq, d], lse[R, Hq]."""
    acc = acc_dtype(q.dtype)
    rows, hq, d = q.shape
    hkv = k.shape[1]
    group = hq // hkv
    out = q.new_empty((rows, hq, d), dtype=acc)
    lse = q.new_empty((rows, hq), dtype=acc)
    for g in range(hkv):
        qg = q[:, g * group : (g + 1) * group].to(acc).reshape(rows * group, d)
        o, s = _attend(qg, pos.repeat_interleave(group), k[:, g].to(acc), v[:, g].to(acc), n_keys, scale)
        out[:, g * group : (g + 1) * group] = o.reshape(rows, group, d)
        lse[:, g * group : (g + 1) * group] = s.reshape(rows, group)
    return out, lse


class _VarlenCausalAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, cu_seqlens, scale):
        out = torch.empty_like(q)
        lse = q.new_empty(q.shape[:2], dtype=acc_dtype(q.dtype))
        bounds = cu_seqlens.tolist()
        for s, e in zip(bounds[:-1], bounds[1:]):
            if e == s:
                continue
            pos = torch.arange(e - s, device=q.device)
            o, l_ = _seq_attention(q[s:e], k[s:e], v[s:e], pos, e - s, scale)
            out[s:e], lse[s:e] = o.to(q.dtype), l_
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.bounds, ctx.scale = bounds, scale
        return out

    @staticmethod
    def backward(ctx, g_out):
        q, k, v, out, lse = ctx.saved_tensors
        acc = lse.dtype
        gq, gk, gv = (torch.zeros_like(t, dtype=acc) for t in (q, k, v))
        group = q.shape[1] // k.shape[1]
        for s, e in zip(ctx.bounds[:-1], ctx.bounds[1:]):
            if e == s:
                continue
            qs = q[s:e].to(acc)
            ks = k[s:e].to(acc).repeat_interleave(group, dim=1)
            vs = v[s:e].to(acc).repeat_interleave(group, dim=1)
            do, o = g_out[s:e].to(acc), out[s:e].to(acc)
            scores = torch.einsum("qhd,khd->hqk", qs, ks) * ctx.scale
            causal = torch.ones(e - s, e - s, dtype=torch.bool, device=q.device).tril()
            p = torch.exp(scores - lse[s:e].T.unsqueeze(-1)).masked_fill(~causal, 0.0)
            dp = torch.einsum("qhd,khd->hqk", do, vs)
            ds = p * (dp - (do * o).sum(-1).T.unsqueeze(-1))
            gq[s:e] = torch.einsum("hqk,khd->qhd", ds, ks) * ctx.scale
            gks = torch.einsum("hqk,qhd->khd", ds, qs) * ctx.scale
            gvs = torch.einsum("hqk,qhd->khd", p, do)
            gk[s:e] = gks.reshape(e - s, k.shape[1], group, -1).sum(2)
            gv[s:e] = gvs.reshape(e - s, k.shape[1], group, -1).sum(2)
        return gq.to(q.dtype), gk.to(k.dtype), gv.to(v.dtype), None, None


def attention(q, k, v, cu_seqlens, scale):
    return _VarlenCausalAttention.apply(q, k, v, cu_seqlens, scale)


@torch.no_grad()
def decode_attention(q, k_cache, v_cache, lengths, scale):
    """One new query per sequence, at position lengths[b]-1, over its cache [0, lengths[b])."""
    out = torch.empty_like(q)
    for b, n in enumerate(lengths.tolist()):
        pos = torch.tensor([n - 1], device=q.device)
        o, _ = _seq_attention(q[b : b + 1], k_cache[b, :n], v_cache[b, :n], pos, n, scale)
        out[b] = o[0].to(q.dtype)
    return out
