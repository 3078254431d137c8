"""Reference causal GQA attention: online softmax over fixed key blocks, so prefill, packed prefill and
decode give a query row the same bits.

Every query row (one head of one token) is processed on its own: scores and the probability-weighted
sum of values are elementwise products reduced over a fixed-size innermost axis (head_dim, then the
`attn_kv_block` keys of a block), so no row's arithmetic depends on how many other rows share the call.
A row at position t visits key blocks 0..t//B. A block entirely after t would be an exact no-op (max
unchanged, exp(0) = 1 rescale, zero probabilities), so rows skip it; whether a call holds the rest of the
sequence (prefill) or only the cache up to t (decode) therefore cannot change the row. All rows of all
sequences and heads go through one vectorised loop over key blocks.
"""

from __future__ import annotations

import torch

from top_rl.kernels.tiled_gemm import acc_dtype, contract_tiling, pad_to


def attend_rows(q, pos, n_keys, kv_index, k_all, v_all, scale):
    """q[R, d] rows; row r sits at position pos[r], sees keys [0, min(pos[r], n_keys[r]-1)] of
    k_all/v_all[kv_index[r]] (shape [N, L, d], L a multiple of the key block). Returns (out, lse)."""
    blk = contract_tiling().attn_kv_block
    m = q.new_full((q.shape[0], 1), float("-inf"))
    l = q.new_zeros((q.shape[0], 1))
    acc = q.new_zeros(q.shape)
    for b in range(int(pos.max()) // blk + 1):
        rows = torch.nonzero(pos >= b * blk).squeeze(1)
        kb = k_all[kv_index[rows], b * blk : (b + 1) * blk]  # [r, blk, d]
        vb_t = v_all[kv_index[rows], b * blk : (b + 1) * blk].transpose(1, 2)  # [r, d, blk]
        key_idx = torch.arange(b * blk, (b + 1) * blk, device=q.device)
        s = (q[rows].unsqueeze(1) * kb).sum(-1) * scale
        hidden = (key_idx[None, :] > pos[rows, None]) | (key_idx[None, :] >= n_keys[rows, None])
        s = s.masked_fill(hidden, float("-inf"))
        m_old = m[rows]
        m_new = torch.maximum(m_old, s.amax(dim=-1, keepdim=True))
        alpha = torch.exp(m_old - m_new)
        p = torch.exp(s - m_new)
        l[rows] = l[rows] * alpha + p.sum(dim=-1, keepdim=True)
        acc[rows] = acc[rows] * alpha + (p.unsqueeze(1) * vb_t).sum(-1)
        m[rows] = m_new
    return acc / l, (m + torch.log(l))[:, 0]


def _seq_layout(cu_seqlens, device):
    bounds = cu_seqlens.tolist()
    lengths = torch.tensor([e - s for s, e in zip(bounds[:-1], bounds[1:])], device=device)
    seq_of_token = torch.repeat_interleave(torch.arange(len(lengths), device=device), lengths)
    pos = torch.arange(bounds[-1], device=device) - cu_seqlens[:-1].to(device)[seq_of_token]
    return lengths, seq_of_token, pos


def _padded_kv(t, seq_of_token, pos, n_seqs, max_len):
    """Packed [T, Hkv, d] -> [n_seqs * Hkv, L, d] (zero padded to whole key blocks)."""
    hkv, d = t.shape[1], t.shape[2]
    L = max_len + (-max_len) % contract_tiling().attn_kv_block
    out = t.new_zeros((n_seqs, L, hkv, d))
    out[seq_of_token, pos] = t
    return out.permute(0, 2, 1, 3).reshape(n_seqs * hkv, L, d)


def _rows(q, hkv):
    """[T, Hq, d] -> rows [T*Hq, d] plus each row's kv head."""
    t, hq, d = q.shape
    kv_head = (torch.arange(hq, device=q.device) // (hq // hkv)).repeat(t)
    return q.reshape(t * hq, d), kv_head


class _VarlenCausalAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, cu_seqlens, scale):
        acc = acc_dtype(q.dtype)
        t, hq, d = q.shape
        hkv = k.shape[1]
        lengths, seq_of_token, pos = _seq_layout(cu_seqlens, q.device)
        max_len = int(lengths.max()) if len(lengths) else 0
        k_all = _padded_kv(k.to(acc), seq_of_token, pos, len(lengths), max_len)
        v_all = _padded_kv(v.to(acc), seq_of_token, pos, len(lengths), max_len)
        rows, kv_head = _rows(q.to(acc), hkv)
        row_seq = seq_of_token.repeat_interleave(hq)
        out, lse = attend_rows(rows, pos.repeat_interleave(hq), lengths[row_seq], row_seq * hkv + kv_head,
                               k_all, v_all, scale)
        out = out.reshape(t, hq, d).to(q.dtype)
        ctx.save_for_backward(q, k, v, out, lse.reshape(t, hq), cu_seqlens)
        ctx.scale = scale
        return out

    @staticmethod
    def backward(ctx, g_out):
        q, k, v, out, lse, cu_seqlens = ctx.saved_tensors
        return _attention_backward(q, k, v, out, lse, cu_seqlens, ctx.scale, g_out) + (None, None)


def _attention_backward(q, k, v, out, lse, cu_seqlens, scale, g_out):
    """Analytic softmax-attention gradient, per sequence (P from the saved log-sum-exp)."""
    acc = lse.dtype
    gq, gk, gv = (torch.zeros_like(t, dtype=acc) for t in (q, k, v))
    group = q.shape[1] // k.shape[1]
    bounds = cu_seqlens.tolist()
    for s, e in zip(bounds[:-1], bounds[1:]):
        if e == s:
            continue
        qs = q[s:e].to(acc)
        ks = k[s:e].to(acc).repeat_interleave(group, dim=1)
        vs = v[s:e].to(acc).repeat_interleave(group, dim=1)
        do, o = g_out[s:e].to(acc), out[s:e].to(acc)
        scores = torch.einsum("qhd,khd->hqk", qs, ks) * scale
        causal = torch.ones(e - s, e - s, dtype=torch.bool, device=q.device).tril()
        p = torch.exp(scores - lse[s:e].T.unsqueeze(-1)).masked_fill(~causal, 0.0)
        dp = torch.einsum("qhd,khd->hqk", do, vs)
        ds = p * (dp - (do * o).sum(-1).T.unsqueeze(-1))
        gq[s:e] = torch.einsum("hqk,khd->qhd", ds, ks) * scale
        gk[s:e] = (torch.einsum("hqk,qhd->khd", ds, qs) * scale).reshape(e - s, k.shape[1], group, -1).sum(2)
        gv[s:e] = torch.einsum("hqk,qhd->khd", p, do).reshape(e - s, k.shape[1], group, -1).sum(2)
    return gq.to(q.dtype), gk.to(k.dtype), gv.to(v.dtype)


def attention(q, k, v, cu_seqlens, scale):
    return _VarlenCausalAttention.apply(q, k, v, cu_seqlens, scale)


@torch.no_grad()
def decode_attention(q, k_cache, v_cache, lengths, scale):
    """One new query per sequence, at position lengths[b]-1, over its cache [0, lengths[b])."""
    acc = acc_dtype(q.dtype)
    b, hq, d = q.shape
    hkv = k_cache.shape[2]
    blk = contract_tiling().attn_kv_block
    k_all = pad_to(k_cache.to(acc).permute(0, 2, 1, 3).reshape(b * hkv, -1, d), 1, blk)
    v_all = pad_to(v_cache.to(acc).permute(0, 2, 1, 3).reshape(b * hkv, -1, d), 1, blk)
    rows, kv_head = _rows(q.to(acc), hkv)
    row_seq = torch.arange(b, device=q.device).repeat_interleave(hq)
    lengths = lengths.to(q.device)
    out, _ = attend_rows(rows, lengths[row_seq] - 1, lengths[row_seq], row_seq * hkv + kv_head, k_all, v_all, scale)
    return out.reshape(b, hq, d).to(q.dtype)
