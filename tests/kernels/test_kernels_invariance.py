"""Batch invariance of every reference kernel: a row's bits do not depend on what else is in the call."""

import random

import pytest
import torch

from top_rl import kernels
from tests.helpers import set_threads, use_backend

DTYPES = [torch.float32, torch.bfloat16]
BATCH_SIZES = list(range(1, 65))


@pytest.fixture(autouse=True)
def reference_backend():
    with use_backend("reference"):
        yield


@pytest.fixture(params=[1, 2], ids=["1thread", "2threads"])
def threads(request):
    prev = set_threads(request.param)
    yield request.param
    torch.set_num_threads(prev)


def _embed(target: torch.Tensor, batch: int, seed: int) -> tuple[torch.Tensor, int]:
    """`target` rows placed at a random offset among `batch - 1` random neighbour rows."""
    g = torch.Generator().manual_seed(seed)
    rows = torch.randn((batch,) + target.shape[1:], generator=g).to(target.dtype) * 3
    at = random.Random(seed).randrange(batch)
    rows[at] = target[0]
    return rows, at


def _check_rowwise(fn, target, dtype):
    alone = fn(target)
    for b in BATCH_SIZES:
        rows, at = _embed(target, b, seed=b)
        assert torch.equal(fn(rows)[at], alone[0]), f"row changed in a batch of {b} ({dtype})"


@pytest.mark.parametrize("dtype", DTYPES)
def test_linear_rows_invariant(dtype, threads):
    w = torch.randn(200, 256).to(dtype)
    _check_rowwise(lambda x: kernels.linear(x, w), torch.randn(1, 256).to(dtype), dtype)
    _check_rowwise(lambda x: kernels.row_linear(x, w), torch.randn(1, 256).to(dtype), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_rows_invariant(dtype, threads):
    w = 1 + 0.1 * torch.randn(96)
    _check_rowwise(lambda x: kernels.rms_norm(x, w, 1e-6), torch.randn(1, 96).to(dtype), dtype)
    res = torch.randn(64, 96)  # fp32 residual stream, row b belongs to row b
    _check_rowwise(lambda x: kernels.rms_norm(x, w, 1e-6, res[: len(x)] * 0 + res[0], torch.float32)[0],
                   torch.randn(1, 96).to(dtype), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_elementwise_ops_rows_invariant(dtype, threads):
    cache = kernels.rope_cache(16, 1e6, 128)
    _check_rowwise(lambda x: kernels.rope(x, torch.full((len(x),), 77), cache), torch.randn(1, 4, 16).to(dtype), dtype)
    _check_rowwise(kernels.silu_and_mul, torch.randn(1, 2 * 80).to(dtype), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_logprob_rows_invariant(dtype, threads):
    vocab = 300
    ids = lambda x: torch.full((len(x),), 7)  # noqa: E731
    _check_rowwise(lambda x: kernels.prefill_logprobs(x, ids(x)), torch.randn(1, vocab).to(dtype), dtype)
    _check_rowwise(lambda x: kernels.sample_logprobs(x, ids(x), 0.7), torch.randn(1, vocab).to(dtype), dtype)
    _check_rowwise(lambda x: kernels.sampler_log_softmax(x, 1.0), torch.randn(1, vocab).to(dtype), dtype)


def _pack(seqs):
    cu = torch.tensor([0] + [len(s) for s in seqs]).cumsum(0)
    return torch.cat(seqs), cu


@pytest.mark.parametrize("dtype", DTYPES)
def test_attention_packing_invariant(dtype, threads):
    g = torch.Generator().manual_seed(0)
    mk = lambda n, h: (torch.randn(n, h, 16, generator=g) * 2).to(dtype)  # noqa: E731
    n_target = 150  # spans three key blocks
    target = (mk(n_target, 4), mk(n_target, 2), mk(n_target, 2))
    alone = kernels.attention(*target, torch.tensor([0, n_target]), 0.25)
    rng = random.Random(0)
    for n_neighbours in (0, 1, 3, 7):
        others = [(mk(k, 4), mk(k, 2), mk(k, 2)) for k in (rng.randint(1, 90) for _ in range(n_neighbours))]
        seqs = others + [target]
        rng.shuffle(seqs)
        at = next(i for i, s in enumerate(seqs) if s is target)
        q, cu = _pack([s[0] for s in seqs])
        k, _ = _pack([s[1] for s in seqs])
        v, _ = _pack([s[2] for s in seqs])
        out = kernels.attention(q, k, v, cu, 0.25)
        assert torch.equal(out[cu[at] : cu[at + 1]], alone)


@pytest.mark.parametrize("dtype", DTYPES)
def test_decode_attention_equals_prefill_rows(dtype, threads):
    g = torch.Generator().manual_seed(1)
    L, cap = 140, 160
    q, k, v = ((torch.randn(L, h, 16, generator=g) * 2).to(dtype) for h in (4, 2, 2))
    prefill = kernels.attention(q, k, v, torch.tensor([0, L]), 0.25)
    for batch in (1, 5, 33):
        kc = torch.randn(batch, cap, 2, 16, generator=g).to(dtype)
        vc = torch.randn(batch, cap, 2, 16, generator=g).to(dtype)
        lengths = torch.randint(1, cap, (batch,), generator=g)
        qs = torch.randn(batch, 4, 16, generator=g).to(dtype)
        for t in (0, 63, 64, 100, L - 1):
            b = t % batch
            kc[b, : t + 1], vc[b, : t + 1], qs[b], lengths[b] = k[: t + 1], v[: t + 1], q[t], t + 1
            out = kernels.decode_attention(qs, kc, vc, lengths, 0.25)
            assert torch.equal(out[b], prefill[t]), (batch, t)


def test_thread_count_does_not_change_bits():
    w = torch.randn(300, 640).to(torch.bfloat16)
    x = torch.randn(70, 640).to(torch.bfloat16)
    prev = set_threads(1)
    one = kernels.linear(x, w)
    torch.set_num_threads(2)
    two = kernels.linear(x, w)
    torch.set_num_threads(prev)
    assert torch.equal(one, two)


def test_plain_backend_linear_is_not_batch_invariant():
    """The property is real on this CPU: stock torch GEMM rows change with the batch size."""
    torch.manual_seed(0)
    w, x = torch.randn(512, 256), torch.randn(64, 256)
    with use_backend("plain"):
        full = kernels.linear(x, w)
        differs = [m for m in range(1, 17) if not torch.equal(kernels.linear(x[:m], w)[0], full[0])]
    assert differs, "plain GEMM unexpectedly batch-invariant here"
