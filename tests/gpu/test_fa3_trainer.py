"""The trainer on fa3 (issue 49 item 4): sgl_kernel's FA3 forward hands its LSE to the flash backward.

The gated forward is the engine's kernel; asking it for the LSE (return_softmax_lse=True) must leave its output
bit for bit as the engine computes it (the engine asks for none). The LSE is FlashAttention-2's varlen layout
already ([Hq, T] fp32, natural log), so the backward reads it as is instead of re-running FA2's forward for one
(top.fast_paths.fa3_lse=false). The gradients then differ from the re-run's by as much as the two kernels' LSEs do:
bounded here, and both against the fp64 formula. Skipped where sgl_kernel's FA3 build is absent (carry the `fa3`
group of scripts/gpu_bundle.sh with `sglang_server`).
"""

from __future__ import annotations

import pytest
import torch

from top_rl import kernels
from tests.gpu._common import QWEN3_06B, needs_cuda, rel_err


def _fa3_error() -> str | None:
    try:
        import sgl_kernel.flash_attn  # noqa: F401
        import sgl_kernel.flash_ops  # noqa: F401  (sglang-kernel's FA3 build: 1 GB, its own carry)
    except Exception as e:  # noqa: BLE001
        return f"no FA3 build in sgl_kernel ({type(e).__name__}: {e}): carry scripts/gpu_bundle.sh fa3 sglang_server"
    return None


_ERR = _fa3_error()
pytestmark = [needs_cuda, pytest.mark.gpu, pytest.mark.skipif(_ERR is not None, reason=_ERR or "")]

HQ, HKV, D = QWEN3_06B["num_attention_heads"], QWEN3_06B["num_key_value_heads"], QWEN3_06B["head_dim"]
LENGTHS = [700, 1, 1300, 64, 4500]  # one past FA3's 128-row tiles many times, one of a single token


@pytest.fixture(autouse=True)
def fa3_backend(monkeypatch):
    from tests.helpers import with_plan

    with_plan(monkeypatch, attention="fa3", attention_backward="flash")


def _cu(lengths):
    return torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), device="cuda")


def _qkv(seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    t = sum(LENGTHS)
    return tuple(torch.randn(t, h, D, generator=g, device="cuda").bfloat16() for h in (HQ, HKV, HKV))


def test_asking_fa3_for_its_lse_leaves_the_engines_output_bitwise():
    from top_rl.kernels import packed_batch
    from top_rl.kernels.sglang import attention as sglang_attention

    q, k, v = _qkv(1)
    cu = _cu(LENGTHS)
    batch = packed_batch.packed_batch(cu)
    plain, none = sglang_attention._fa3_prefill(q, k, v, batch, D**-0.5, want_lse=False)
    with_lse, lse = sglang_attention._fa3_prefill(q, k, v, batch, D**-0.5, want_lse=True)
    assert none is None and torch.equal(plain, with_lse), "return_softmax_lse changed fa3's output"
    assert lse.shape == (HQ, q.shape[0]) and lse.dtype == torch.float32 and lse.is_contiguous()
    # and the whole trainer path with a gradient wanted gives the no-gradient (gate) forward's bits
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    assert torch.equal(kernels.attention(*leaves, cu, D**-0.5), plain)


def test_fa3s_lse_is_what_the_flash_backward_reads():
    """fa3's LSE against FlashAttention-2's own forward LSE for the same inputs: same layout and units, close (two
    kernels; not the same bits)."""
    from top_rl.kernels import packed_batch
    from top_rl.kernels.sglang import attention as sglang_attention

    q, k, v = _qkv(2)
    cu = _cu(LENGTHS)
    _, lse = sglang_attention._fa3_prefill(q, k, v, packed_batch.packed_batch(cu), D**-0.5, want_lse=True)
    cu32 = cu.to(torch.int32)
    _, fa_lse, *_ = torch.ops.aten._flash_attention_forward(q, k, v, cu32, cu32, max(LENGTHS), max(LENGTHS), 0.0, True,
                                                            False, scale=D**-0.5)
    assert lse.shape == fa_lse.shape, (lse.shape, fa_lse.shape)
    diff = (lse - fa_lse).abs().max().item()
    print(f"fa3 LSE vs FlashAttention-2's: max |diff| {diff:.2e}")
    torch.testing.assert_close(lse, fa_lse, rtol=0, atol=4e-3)


def test_gradients_with_fa3s_lse_equal_the_rerun_ones(monkeypatch):
    """The flash backward fed fa3's output and LSE against the same backward after a re-run FA2 forward
    (top.fast_paths.fa3_lse=false), and both against the fp64 formula."""
    from tests.gpu.test_grads import _attn_ref, _check
    from tests.helpers import with_plan
    from top_rl.kernels.sglang import attention_backward

    cu = _cu(LENGTHS)
    q, k, v = _qkv(5)
    g = torch.Generator(device="cuda").manual_seed(6)
    go = torch.randn(q.shape, generator=g, device="cuda")
    scale = D**-0.5
    reran = []  # the forward-LSE path really ran for "1" (else both runs re-run and agree trivially)
    forward = attention_backward.flash_attention_forward
    monkeypatch.setattr(attention_backward, "flash_attention_forward", lambda *a: reran.append(1) or forward(*a))
    grads = {}
    for flag in ("1", "0"):
        with_plan(monkeypatch, fa3_lse=flag == "1")
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        before = len(reran)
        kernels.attention(*leaves, cu, scale).float().backward(go)
        assert (len(reran) == before) == (flag == "1"), f"fa3_lse={flag}: forward re-run?"
        grads[flag] = [t.grad for t in leaves]
    small = [700, 1, 300, 64]  # the fp64 formula is O(L^2) per sequence: a smaller batch
    qs, ks, vs = (t[: sum(small)] for t in (q, k, v))
    cus = _cu(small)
    for flag in ("1", "0"):
        with_plan(monkeypatch, fa3_lse=flag == "1")
        _check(lambda a, b, c: kernels.attention(a, b, c, cus, scale), lambda a, b, c: _attn_ref(a, b, c, cus, scale),
               [qs, ks, vs], go[: sum(small)], 2e-2)
    for name, a, b in zip("qkv", grads["1"], grads["0"]):
        print(f"d{name}: relative error {rel_err(a, b):.2e} between fa3's-LSE and the re-run backward")
        assert rel_err(a, b) < 1e-2, f"d{name}: relative error {rel_err(a, b)} between the two backwards"
    assert not attention_backward._flash_backward_failed, attention_backward._flash_backward_failed
