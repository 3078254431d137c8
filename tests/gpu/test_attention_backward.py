"""Both attention backward kernels of the `sglang` backend (FlashAttention-2, the default for bf16; memory-efficient,
TOP_RL_ATTENTION_BACKWARD=efficient) against autograd through the fp64 formula, on packed GQA sequences, and the
flash path really taken (no silent fallback)."""

from __future__ import annotations

import pytest
import torch

from top_rl import kernels
from tests.helpers import with_plan
from top_rl.kernels.sglang import attention_backward
from tests.gpu._common import needs_cuda
from tests.gpu.test_grads import _attn_ref, _check

pytestmark = [needs_cuda, pytest.mark.gpu]


@pytest.mark.parametrize("kernel", ["flash", "efficient"])
def test_backward_kernel(kernel, monkeypatch):
    with_plan(monkeypatch, attention_backward=kernel)
    lengths = [700, 1, 1300, 64]
    t = sum(lengths)
    cu = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), device="cuda")
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(t, h, 128, generator=g, device="cuda").bfloat16() for h in (16, 8, 8))
    go = torch.randn(t, 16, 128, generator=g, device="cuda")
    scale = 128**-0.5
    _check(lambda a, b, c: kernels.attention(a, b, c, cu, scale), lambda a, b, c: _attn_ref(a, b, c, cu, scale),
           [q, k, v], go, 2e-2)
    assert not attention_backward._flash_backward_failed, attention_backward._flash_backward_failed


def test_recompute_attention_keeps_the_gated_forward_and_takes_flash_in_the_recompute(monkeypatch):
    """top.fast_paths.recompute_attention on the real kernels: a checkpointed attention's output (what the loss and
    the gate see) is bitwise the engine kernel's, the recompute ran FlashAttention-2's forward (recorded), and the
    gradients are those of the default recompute within bf16 attention's rounding."""
    from top_rl.train import recompute

    lengths = [700, 1, 1300, 64]
    t = sum(lengths)
    cu = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), device="cuda")
    g = torch.Generator(device="cuda").manual_seed(1)
    inputs = [torch.randn(t, h, 128, generator=g, device="cuda").bfloat16() for h in (16, 8, 8)]
    go = torch.randn(t, 16, 128, generator=g, device="cuda").bfloat16()
    scale = 128**-0.5
    results = {}
    for switch in (False, True):
        with_plan(monkeypatch, recompute_attention=switch)
        q, k, v = (x.clone().requires_grad_() for x in inputs)
        out = recompute.non_reentrant_checkpoint(lambda a, b, c: kernels.attention(a, b, c, cu, scale), False, q, k, v)
        out.backward(go)
        results[switch] = (out.detach(), q.grad, k.grad, v.grad)
    assert torch.equal(results[True][0], results[False][0])  # the gated forward: the engine's kernel either way
    for got, want in zip(results[True][1:], results[False][1:]):
        err = float((got.double() - want.double()).norm() / want.double().norm())
        assert err < 2e-2, err
    assert kernels.report()["paths"].get("attention_recompute") == "flash_varlen", kernels.report()
