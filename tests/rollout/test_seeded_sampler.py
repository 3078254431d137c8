"""top_rl/rollout/native/seeded_sampler.py against SGLang's own code, on CPU: its Triton `murmur_hash32_kernel`
(sglang/srt/layers/utils/hash.py) run by Triton's CPU interpreter, and its `multinomial_with_seed`'s eager body
(sglang/srt/layers/sampler.py; the wheel wraps it in torch.compile, whose code needs a GPU for the Triton hash, so
the undecorated function runs, with the interpreted kernel as its hash). Then the native engine end to end: every
token it samples is SGLang's choice at position len(prompt) + k - 1. The compiled function on CUDA:
tests/gpu/test_seeded_sampler.py."""

from __future__ import annotations

import importlib.util
import random
from pathlib import Path

import pytest
import torch

from tests import sglang_cpu

from top_rl import kernels  # noqa: E402
from top_rl.model import pack  # noqa: E402
from top_rl.rollout.native import seeded_sampler as ss  # noqa: E402
from top_rl.engine.interface import SamplingParams  # noqa: E402
from top_rl.rollout.native.engine import NativeEngine  # noqa: E402
from tests.helpers import random_sequences, tiny_model, use_backend  # noqa: E402

_ERR = sglang_cpu.import_error()
pytestmark = pytest.mark.skipif(_ERR is not None, reason=_ERR or "")

VOCAB = 151936  # Qwen3's
EDGE_SEEDS = [0, 1, 42, 2**31 - 1, 2**32 - 1, 2**32, 2**32 + 1, 2**40 + 12345, 2**63 - 1, -1, -(2**63)]
EDGE_POSITIONS = [0, 1, 63, 64, 4095, 2**31 - 1, 2**32 - 1, 2**32, 2**32 + 7, 2**40 + 3, 123456]


@pytest.fixture(scope="module")
def sglang_code():
    """(SGLang's murmur_hash32 under the interpreter, SGLang's eager multinomial_with_seed calling it)."""
    pytest.importorskip("triton")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRITON_INTERPRET", "1")  # Triton decides at @jit time: set before the file is loaded
        import sglang

        from top_rl import sglang_release

        path = Path(sglang.__file__).parent / sglang_release.get(sglang.__version__).murmur_hash_file
        spec = importlib.util.spec_from_file_location("_sglang_hash_interpreted", path)
        hash_mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(hash_mod)
        with sglang_cpu.cpu_imports():
            from sglang.srt.layers import sampler

        mp.setattr(sampler, "murmur_hash32", hash_mod.murmur_hash32)
        yield hash_mod.murmur_hash32, sampler.multinomial_with_seed._torchdynamo_orig_callable


def _theirs_hash(sglang_code, seeds, positions, cols):
    return sglang_code[0](seeds.to(torch.uint64), positions, cols).to(torch.int64)


def test_hash_equals_sglangs_kernel_at_edge_seeds_positions_and_vocab_tail(sglang_code):
    seeds = torch.tensor([s for s in EDGE_SEEDS for _ in EDGE_POSITIONS], dtype=torch.int64)
    positions = torch.tensor(EDGE_POSITIONS * len(EDGE_SEEDS), dtype=torch.int64)
    cols = torch.cat([torch.arange(0, 1500), torch.arange(VOCAB - 2600, VOCAB)])  # head, and Qwen3's tail
    ours = ss.murmur_hash32_torch(seeds, positions, cols)
    assert torch.equal(ours, _theirs_hash(sglang_code, seeds, positions, cols))
    assert int(ours.min()) >= 0 and int(ours.max()) < 2**32
    # SGLang's kernel loads the position as uint32: 2**32 is position 0; all else hashes apart
    by_pair = dict(zip(zip(seeds.tolist(), (p % 2**32 for p in positions.tolist())), ours[:, 0].tolist()))
    assert len(set(by_pair.values())) == len(by_pair) == len(seeds) - len(EDGE_SEEDS)


def test_hash_equals_sglangs_kernel_on_random_rows_and_the_whole_vocab(sglang_code):
    g = torch.Generator().manual_seed(0)
    seeds = torch.randint(-(2**63), 2**63 - 1, (48,), generator=g, dtype=torch.int64)
    positions = torch.randint(0, 2**33, (48,), generator=g, dtype=torch.int64)
    cols = torch.arange(3000)
    assert torch.equal(ss.murmur_hash32_torch(seeds, positions, cols), _theirs_hash(sglang_code, seeds, positions, cols))
    whole = torch.arange(VOCAB)
    assert torch.equal(ss.murmur_hash32(seeds[:2], positions[:2], VOCAB),
                       _theirs_hash(sglang_code, seeds[:2], positions[:2], whole))


def _logprobs(n, vocab, seed, scale=3.0, dtype=torch.bfloat16):
    """The sampler's log-probs of random logits (reference kernels: bf16 like the engine's), some -inf columns."""
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(n, vocab, generator=g) * scale).to(dtype)
    logits[torch.rand(n, vocab, generator=g) < 0.01] = float("-inf")
    with use_backend("reference"):
        return kernels.sampler_log_softmax(logits, 0.8)


@pytest.mark.parametrize("n,vocab,scale", [(512, 96, 3.0), (256, 1000, 1.0), (64, 1000, 12.0), (3, VOCAB, 2.0)])
def test_tokens_equal_sglangs_multinomial_with_seed(sglang_code, n, vocab, scale):
    lp = _logprobs(n, vocab, seed=vocab + n, scale=scale)
    rng = random.Random(n)
    seeds = torch.tensor([rng.choice(EDGE_SEEDS + [rng.randrange(-(2**63), 2**63)]) for _ in range(n)])
    positions = torch.tensor([rng.choice(EDGE_POSITIONS[:5] + [rng.randrange(0, 40000)]) for _ in range(n)])
    ours = ss.multinomial_with_seed(lp, seeds, positions)
    theirs = sglang_code[1](lp, seeds, positions)[:, 0]
    assert torch.equal(ours, theirs)
    if vocab <= 1000:  # a spread of choices, not one token everywhere
        assert len(set(ours.tolist())) > min(vocab, n) // 4


def test_a_row_alone_and_inside_a_batch_gets_the_same_token():
    lp = _logprobs(64, 1000, seed=1)
    seeds = torch.arange(64) * 7919
    positions = torch.arange(64) * 3
    batch = ss.multinomial_with_seed(lp, seeds, positions)
    alone = torch.cat([ss.multinomial_with_seed(lp[i:i + 1], seeds[i:i + 1], positions[i:i + 1]) for i in range(64)])
    assert torch.equal(alone, batch)
    assert not torch.equal(ss.multinomial_with_seed(lp, seeds, positions + 1), batch)  # the position is in the hash


def test_seeds_outside_int64_are_refused():
    ss.check_seeds([0, 2**63 - 1, -(2**63)])
    with pytest.raises(ValueError, match="sampling seed 9223372036854775808 is outside int64"):
        ss.check_seeds([1, 2**63])
    engine = NativeEngine(tiny_model())
    with pytest.raises(ValueError, match="outside int64"):
        engine.generate([[3, 4]], [-(2**63) - 1], SamplingParams(2))


def test_sglangs_own_hash_file_loads_without_the_package():
    fn = ss.sglang_murmur_hash32()
    assert fn is not None and fn.__module__ == "_top_rl_sglang_hash"
    assert ss.hash_impl(torch.device("cpu")) == "torch"  # Triton's kernel needs CUDA tensors


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_engine_tokens_are_sglangs_choice_at_every_step(sglang_code, dtype):
    """Teacher-forced: for every sample and step k, SGLang's multinomial_with_seed over the sampler's log-probs of the
    model's logits after prompt + response[:k], with the sample's seed at position len(prompt) + k - 1, picks
    response[k], and the engine's sample log-prob is that distribution's."""
    with use_backend("reference"):
        model = tiny_model(dtype, seed=5)
        prompts = random_sequences(6, 2, 9, model.cfg.vocab_size, 3)
        seeds = [11, 2**40 + 3, 0, 2**63 - 1, 77, 5]
        samples = NativeEngine(model, "decode", eos_token_id=-1).generate(prompts, seeds, SamplingParams(10, 0.9))
        steps = 0
        for s, seed in zip(samples, seeds):
            seqs = [s.prompt_ids + s.response_ids[:k] for k in range(len(s.response_ids))]
            ids, pos, cu = pack(seqs)
            with torch.no_grad():
                lp = kernels.sampler_log_softmax(model(ids, pos, cu, logit_rows=cu[1:] - 1), 0.9)
            positions = torch.tensor([len(q) - 1 for q in seqs])
            theirs = sglang_code[1](lp, torch.full((len(seqs),), seed), positions)[:, 0]
            assert theirs.tolist() == s.response_ids
            assert lp[torch.arange(len(seqs)), theirs].tolist() == s.sample_logprobs
            steps += len(seqs)
        assert steps == 60
