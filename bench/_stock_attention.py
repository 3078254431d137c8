"""Varlen causal attention for the stock baseline: the fastest of torch's own fused kernels that is correct here.

Candidates (packed THD q[T, Hq, d], k/v[T, Hkv, d], cu_seqlens), each an autograd.Function over aten ops:
  flash      aten::_flash_attention_forward/backward (FlashAttention-2 in torch), GQA native
  cudnn      aten::_cudnn_attention_forward/backward with ragged cu_seqlens (cuDNN SDPA), K/V heads repeated
  efficient  aten::_efficient_attention_forward/backward (xFormers/CUTLASS), K/V heads repeated
`select()` checks each one's output and gradients against fp32 math attention per sequence (tolerance: an
independent implementation) on a small packed batch and on the real one, and times fwd+bwd on the real batch;
the fastest correct one is used. A candidate that raises or is wrong is reported with the reason, never used.
"""

from __future__ import annotations

import torch

from bench._trainer_common import Timer, median
from top_rl.kernels.stock import _FlashVarlen  # the non-TOP job's flash path: one class for both


def _expand(t, group):
    return t if group == 1 else t.repeat_interleave(group, dim=1)


def _fold(g, hkv):
    t, hq, d = g.shape
    return g if hq == hkv else g.reshape(t, hkv, hq // hkv, d).sum(2)


class _CudnnVarlen(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, cu, max_len, scale):
        hkv = k.shape[1]
        group = q.shape[1] // hkv
        ke, ve = _expand(k, group).contiguous(), _expand(v, group).contiguous()
        res = torch.ops.aten._cudnn_attention_forward(q, ke, ve, None, cu, cu, max_len, max_len, True, 0.0, True,
                                                      False, scale=scale)
        out, lse, seed, offset = res[0], res[1], res[6], res[7]
        ctx.save_for_backward(q, ke, ve, out, lse, cu, seed, offset)
        ctx.max_len, ctx.scale, ctx.hkv = max_len, scale, hkv
        return out

    @staticmethod
    def backward(ctx, g):
        q, ke, ve, out, lse, cu, seed, offset = ctx.saved_tensors
        dq, dk, dv = torch.ops.aten._cudnn_attention_backward(
            g.contiguous(), q, ke, ve, out, lse, seed, offset, q.new_empty(0), cu, cu, ctx.max_len, ctx.max_len,
            0.0, True, scale=ctx.scale)
        return dq, _fold(dk, ctx.hkv), _fold(dv, ctx.hkv), None, None, None


class _EfficientVarlen(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, cu, max_len, scale):
        hkv = k.shape[1]
        group = q.shape[1] // hkv
        qb, kb, vb = q.unsqueeze(0), _expand(k, group).unsqueeze(0), _expand(v, group).unsqueeze(0)
        out, lse, seed, offset, _, _ = torch.ops.aten._efficient_attention_forward(
            qb, kb, vb, None, cu, cu, max_len, max_len, 0.0, 1, True, scale=scale)
        ctx.save_for_backward(qb, kb, vb, out, lse, cu, seed, offset)
        ctx.max_len, ctx.scale, ctx.hkv = max_len, scale, hkv
        return out[0]

    @staticmethod
    def backward(ctx, g):
        qb, kb, vb, out, lse, cu, seed, offset = ctx.saved_tensors
        dq, dk, dv, _ = torch.ops.aten._efficient_attention_backward(
            g.contiguous().unsqueeze(0), qb, kb, vb, None, out, cu, cu, ctx.max_len, ctx.max_len, lse, 0.0, seed,
            offset, 1, False, scale=ctx.scale)
        return dq[0], _fold(dk[0], ctx.hkv), _fold(dv[0], ctx.hkv), None, None, None


def _math(q, k, v, cu, max_len, scale):
    """fp32 reference: dense causal softmax attention per sequence (autograd through torch ops)."""
    group = q.shape[1] // k.shape[1]
    outs = []
    bounds = cu.tolist()
    for s, e in zip(bounds[:-1], bounds[1:]):
        qs, ks, vs = (t[s:e].float().transpose(0, 1) for t in (q, _expand(k, group), _expand(v, group)))
        scores = (qs @ ks.transpose(1, 2)) * scale
        mask = torch.ones(e - s, e - s, dtype=torch.bool, device=q.device).tril()
        p = scores.masked_fill(~mask, float("-inf")).softmax(-1)
        outs.append((p @ vs).transpose(0, 1))
    return torch.cat(outs).to(q.dtype)


IMPLS = {"flash": _FlashVarlen.apply, "cudnn": _CudnnVarlen.apply, "efficient": _EfficientVarlen.apply}
_chosen: dict = {"name": None}


def attention(q, k, v, cu, max_len, scale):
    """The selected implementation (`select` must have run; the CPU smoke test selects `math`)."""
    name = _chosen["name"]
    if name is None:
        raise RuntimeError("bench/_stock_attention.use(name) was not called before the stock model ran")
    return _math(q, k, v, cu, max_len, scale) if name == "math" else IMPLS[name](q, k, v, cu, max_len, scale)


def _inputs(lengths, hq, hkv, d, device, seed, grad=True):
    g = torch.Generator(device=device).manual_seed(seed)
    t = sum(lengths)
    q, k, v = (torch.randn(t, h, d, generator=g, device=device).bfloat16().requires_grad_(grad) for h in (hq, hkv, hkv))
    cu = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32, device=device)
    return q, k, v, cu


def _rel(a, b):
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30))


def check(name, hq, hkv, d, device, lengths=(37, 300, 1000, 5), tol=2e-2) -> str | None:
    """None if `name` matches fp32 math attention (out, dq, dk, dv) on a packed batch; else the reason."""
    lengths = list(lengths)
    q, k, v, cu = _inputs(lengths, hq, hkv, d, device, seed=1)
    go = torch.randn_like(q)
    scale = d ** -0.5
    try:
        out = IMPLS[name](q, k, v, cu, max(lengths), scale)
        grads = torch.autograd.grad(out, (q, k, v), go)
    except Exception as e:  # noqa: BLE001 - any failure disqualifies the candidate, with its message
        return f"raises {type(e).__name__}: {str(e).splitlines()[0][:160]}"
    ref = _math(q, k, v, cu, max(lengths), scale)
    ref_grads = torch.autograd.grad(ref, (q, k, v), go)
    errs = {"out": _rel(out, ref), **{n: _rel(a, b) for n, a, b in zip(("dq", "dk", "dv"), grads, ref_grads)}}
    bad = {n: e for n, e in errs.items() if not e < tol}
    return None if not bad else "wrong: rel err " + ", ".join(f"{n}={e:.3g}" for n, e in bad.items())


def select(lengths, hq, hkv, d, device, candidates=("flash", "efficient", "cudnn"), on_row=None):
    """Check and time each candidate (fwd+bwd ms on this batch); returns the rows [name, ms | None, status].
    `on_row` gets each row as soon as it is known (a candidate that kills the process still leaves the
    earlier rows behind); cuDNN goes last for that reason."""
    rows = []
    timer = Timer(device)
    for name in candidates:
        why = check(name, hq, hkv, d, device) or check(name, hq, hkv, d, device, lengths)  # edge cases, real batch
        ms = None
        if why is None:
            q, k, v, cu = _inputs(lengths, hq, hkv, d, device, seed=2)
            go = torch.randn_like(q)
            max_len = max(lengths)

            def step():
                torch.autograd.grad(IMPLS[name](q, k, v, cu, max_len, d ** -0.5), (q, k, v), go)

            step()
            ms = median([timer(step) for _ in range(3)])
        row = [name, ms, why or "ok"]
        rows.append(row)
        if on_row is not None:
            on_row(row)
    return rows


def fastest(rows) -> str | None:
    ok = [(ms, name) for name, ms, status in rows if status == "ok" and ms is not None]
    return min(ok)[1] if ok else None


def use(name: str) -> None:
    """The implementation the stock model runs (`math`: the fp32 reference, CPU smoke test only)."""
    if name not in IMPLS and name != "math":
        raise ValueError(f"unknown stock attention {name!r}; choose one of {sorted(IMPLS)} or 'math'")
    _chosen["name"] = name
