"""Every analytic backward of the reference backend against finite differences in float64."""

import pytest
import torch
from torch.autograd import gradcheck

from top_rl.kernels import reference as R
from top_rl.kernels import rope_cache


def f64(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float64).requires_grad_()


@pytest.mark.slow  # over 30 s (--durations, issue 25)
def test_linear_and_row_linear():
    x, w = f64(5, 70), f64(130, 70, seed=1)  # pads rows, columns and the K chunk
    assert gradcheck(R.linear, (x, w))
    assert gradcheck(R.row_linear, (x, w))


def test_rms_norm_plain_and_residual():
    x, w, r = f64(6, 40), f64(40, seed=1), f64(6, 40, seed=2)
    assert gradcheck(lambda a, b: R.rms_norm(a, b, 1e-6), (x, w))
    assert gradcheck(lambda a, b, c: R.rms_norm(a, b, 1e-6, c), (x, w, r))  # both outputs: norm and residual


def test_rope():
    cache = rope_cache(8, 10000.0, 32).double()
    pos = torch.tensor([0, 1, 2, 5, 3, 31])
    assert gradcheck(lambda a: R.rope(a, pos, cache), (f64(6, 3, 8),))


def test_silu_and_mul():
    assert gradcheck(R.silu_and_mul, (f64(4, 10),))


@pytest.mark.parametrize("temperature", [None, 1.0, 0.7])
def test_token_logprobs(temperature):
    ids = torch.tensor([1, 5, 3, 10])
    if temperature is None:
        fn = lambda a: R.prefill_logprobs(a, ids)  # noqa: E731
    else:
        fn = lambda a: R.sample_logprobs(a, ids, temperature)  # noqa: E731
    assert gradcheck(fn, (f64(4, 11),))


@pytest.mark.parametrize("group", [1, 2, 4])
def test_varlen_causal_gqa_attention(group):
    q = f64(13, 4, 8)
    k, v = f64(13, 4 // group, 8, seed=1), f64(13, 4 // group, 8, seed=2)
    cu = torch.tensor([0, 5, 6, 13])
    assert gradcheck(lambda a, b, c: R.attention(a, b, c, cu, 0.35), (q, k, v))


def test_attention_backward_matches_autograd_of_dense_reference():
    """Same gradients as autograd through a textbook dense implementation, across key blocks."""
    q, k, v = f64(70, 2, 4), f64(70, 1, 4, seed=1), f64(70, 1, 4, seed=2)
    cu = torch.tensor([0, 70])
    g = torch.randn(70, 2, 4, dtype=torch.float64)
    ours = torch.autograd.grad((R.attention(q, k, v, cu, 0.5) * g).sum(), (q, k, v))
    kk, vv = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
    s = torch.einsum("qhd,khd->hqk", q, kk) * 0.5
    s = s.masked_fill(~torch.ones(70, 70, dtype=torch.bool).tril(), float("-inf"))
    dense = torch.einsum("hqk,khd->qhd", s.softmax(-1), vv)
    ref = torch.autograd.grad((dense * g).sum(), (q, k, v))
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)
