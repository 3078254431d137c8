"""SiLU-and-mul's backward as one Triton pass: read the gate/up row halves and the output gradient once, write both
halves of the input gradient.

Gradients need to be right, not bitwise anything (backward.py); this computes reference.silu_and_mul_grad's
formula in fp32: with s = sigmoid(a), d a = go * b * s * (1 + a * (1 - s)), d b = go * a * s. Inductor compiled that
formula (with its torch.cat) to a kernel that took 0.5 ms per layer at 16k tokens of Qwen3-0.6B on the H200, over
three times what its bytes need (bench/RESULTS.md). tests/gpu/test_grads.py checks it against the fp64 formula and
the compiled one; tests/gpu/test_fused_forward.py that the backend runs it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 1024


@triton.jit
def _silu_and_mul_grad(g_ptr, go_ptr, out_ptr, D, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < D
    half = g_ptr + row * 2 * D
    a = tl.load(half + cols, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(half + D + cols, mask=mask, other=0.0).to(tl.float32)
    go = tl.load(go_ptr + row * D + cols, mask=mask, other=0.0).to(tl.float32)
    s = 1.0 / (1.0 + tl.exp(-a))
    ga = go * b * s * (1.0 + a * (1.0 - s))
    gb = go * a * s
    dst = out_ptr + row * 2 * D
    tl.store(dst + cols, ga.to(out_ptr.dtype.element_ty), mask=mask)
    tl.store(dst + D + cols, gb.to(out_ptr.dtype.element_ty), mask=mask)


def silu_and_mul_grad(g: torch.Tensor, go: torch.Tensor) -> torch.Tensor:
    """d g of silu(g[..., :D]) * g[..., D:] given go = d out, in g's dtype and shape."""
    g2 = g.contiguous()
    d = g2.shape[-1] // 2
    rows = g2.numel() // g2.shape[-1]
    go2 = go.contiguous()
    out = torch.empty_like(g2)
    if rows:
        _silu_and_mul_grad[(rows, triton.cdiv(d, BLOCK))](g2, go2, out, d, BLOCK=BLOCK)
    return out
