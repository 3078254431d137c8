"""On CUDA, the native engine's sampler against what a live SGLang server runs: SGLang's own `multinomial_with_seed`
(sglang/srt/layers/sampler.py, torch.compile(dynamic=True): Inductor's Triton code, with SGLang's Triton murmur hash
inside). Ours on CUDA is SGLang's Triton hash (loaded from the wheel's file) and seeded_sampler.gumbel_argmax run
eagerly; where SGLang or Triton is missing, our torch hash. Both must pick the compiled function's tokens, torch.equal,
at Qwen3's vocabulary (151936) over many rows, seeds (edges of int64 included) and positions. CPU half, against
SGLang's eager body and its kernel in Triton's interpreter: tests/rollout/test_seeded_sampler.py."""

from __future__ import annotations

import pytest
import torch

from top_rl import kernels
from top_rl.rollout.native import seeded_sampler as ss
from tests.gpu._common import needs_cuda

pytestmark = [needs_cuda, pytest.mark.gpu]

if torch.cuda.is_available():  # before SGLang's sampler module is imported: the contract's env, the sgl_kernel stand-in
    from tests.doubles.sglang_reference import prepare_process

    prepare_process()

VOCAB = 151936
ROWS, CHUNK = 2048, 256
EDGE_SEEDS = [0, 1, 42, 2**32 - 1, 2**32, 2**63 - 1, -1, -(2**63)]


@pytest.fixture(scope="module")
def sglang_multinomial():
    from sglang.srt.layers.sampler import multinomial_with_seed

    return multinomial_with_seed


def _rows(chunk: int):
    """Sampler log-probs (the sglang backend's lsm_BI, bf16) of random logits at several scales and temperatures,
    with their seeds and positions."""
    g = torch.Generator(device="cuda").manual_seed(chunk)
    scale = [0.5, 2.0, 8.0, 30.0][chunk % 4]
    logits = (torch.randn(CHUNK, VOCAB, generator=g, device="cuda") * scale).bfloat16()
    lp = kernels.sampler_log_softmax(logits, [1.0, 0.7, 1.3, 0.25][chunk % 4])
    seeds = torch.randint(-(2**63), 2**63 - 1, (CHUNK,), generator=g, device="cuda", dtype=torch.int64)
    seeds[: len(EDGE_SEEDS)] = torch.tensor(EDGE_SEEDS, device="cuda")
    positions = torch.randint(0, 1 << 20, (CHUNK,), generator=g, device="cuda", dtype=torch.int64)
    positions[:3] = torch.tensor([0, 1, 2**32 - 1], device="cuda")
    return lp, seeds, positions


def test_engine_sampler_runs_sglangs_hash_on_cuda():
    assert ss.hash_impl(torch.device("cuda")) == "sglang-triton"


@pytest.mark.parametrize("hash_impl", ["sglang-triton", "torch"])
def test_tokens_equal_sglangs_compiled_multinomial_with_seed(sglang_multinomial, monkeypatch, hash_impl):
    monkeypatch.setattr(ss, "hash_impl", lambda device: hash_impl)
    differ = 0
    for chunk in range(ROWS // CHUNK):
        lp, seeds, positions = _rows(chunk)
        ours = ss.multinomial_with_seed(lp, seeds, positions)
        theirs = sglang_multinomial(lp, seeds, positions)[:, 0]
        differ += int((ours != theirs).sum())
    assert differ == 0, f"{differ}/{ROWS} rows pick another token than SGLang's compiled multinomial_with_seed"


def test_torch_hash_equals_sglangs_triton_hash_on_cuda():
    for chunk in range(2):
        _, seeds, positions = _rows(chunk)
        theirs = ss.sglang_murmur_hash32()(seeds.to(torch.uint64), positions, torch.arange(VOCAB, device="cuda"))
        ours = ss.murmur_hash32_torch(seeds, positions, torch.arange(VOCAB, device="cuda"))
        assert torch.equal(ours, theirs.to(torch.int64))


def test_a_row_alone_and_inside_a_batch_gets_the_same_token():
    lp, seeds, positions = _rows(5)
    batch = ss.multinomial_with_seed(lp, seeds, positions)
    for i in (0, 7, 100, CHUNK - 1):
        assert torch.equal(ss.multinomial_with_seed(lp[i:i + 1], seeds[i:i + 1], positions[i:i + 1]), batch[i:i + 1])
