"""Issue 30: a run whose sizes this host cannot hold is refused before it starts (top_rl/driver/host_memory.py), by
bounds that are honest: below what the run really allocates, measured here on the real objects."""

from __future__ import annotations

import pickle
import tracemalloc
import weakref

import pytest
import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from tests.helpers import tiny_model, use_backend

from top_rl import kernels  # noqa: E402
from top_rl.driver import host_memory  # noqa: E402
from top_rl.rl.batch import RLBatch, RLSample  # noqa: E402
from top_rl.engine.interface import SamplingParams  # noqa: E402
from top_rl.rollout.native.engine import NativeEngine  # noqa: E402


@pytest.mark.parametrize("n_samples, max_new_tokens", [(32, 1), (16, 6)])
def test_the_batch_bound_is_below_what_the_driver_holds(n_samples, max_new_tokens):
    """Samples from the real engine, delivered as Ray delivers them (pickled), and the RLBatch the loop builds from them:
    together they take more memory than the bound counts for a step of one-token prompts whose responses all run to
    max_new_tokens (the step the bound describes)."""
    with use_backend("reference"):
        engine = NativeEngine(tiny_model(), "decode", eos_token_id=-1)  # no eos: every response runs to the limit
        raw = engine.generate([[5]] * n_samples, list(range(n_samples)), SamplingParams(max_new_tokens, 1.0))
    assert all(len(s.response_ids) == max_new_tokens for s in raw)
    delivered = pickle.dumps(raw)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        samples = pickle.loads(delivered)
        batch = RLBatch([RLSample.from_rollout(s, 0.5, i) for i, s in enumerate(samples)], 1.0, "decode", 1)
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(batch.samples) == n_samples
    assert held >= n_samples * host_memory.sample_bytes(max_new_tokens), held


def test_the_refusal_names_the_largest_step_the_bound_allows():
    host = host_memory.host_bytes()
    per_prompt = 16 * host_memory.sample_bytes(2)
    fits = host // per_prompt
    assert host_memory.refusal(fits, 16, 2, None, host) is None
    refusal = host_memory.refusal(fits + 1, 16, 2, None, host)
    assert refusal.startswith(f"this host's {host / 2**30:,.1f} GiB of memory cannot hold the run: it needs at least ")
    assert f"for a step's batch on the driver (rollout.prompts_per_step={fits + 1} x rollout.n_samples=16 samples x " \
           "(>= 1 prompt token x 16 B + rollout.max_new_tokens=2 x 96 B)). Lower rollout.prompts_per_step (over " \
           f"{fits:,} cannot fit here), rollout.n_samples or rollout.max_new_tokens" in refusal


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_engine_model_bound_is_below_the_real_model(dtype):
    """An engine on the CPU holds at least param_count x model.dtype's bytes (its embedding and norms are fp32)."""
    model = tiny_model(dtype)
    real = sum(p.numel() * p.element_size() for p in model.parameters())
    models = host_memory.cpu_models(model.cfg, dtype, engines=1, trainer_replicas=0)
    assert sum(p.numel() for p in model.parameters()) == models.params
    assert models.bytes <= real


@pytest.mark.parametrize("dtype, max_new_tokens", [("float32", 2), ("bfloat16", 5)])
def test_the_engine_call_bound_is_below_the_kv_cache_the_native_engine_allocates(monkeypatch, dtype, max_new_tokens):
    """Issue 54: one native generate call holds the KV cache of every row at once; the bound counts one-token prompts."""
    model = tiny_model(dtype)
    held = []
    real = type(model).new_kv_cache

    def recorded(self, slots, max_len):
        cache = real(self, slots, max_len)
        held.append(cache.k.nbytes + cache.v.nbytes)
        return cache
    monkeypatch.setattr(type(model), "new_kv_cache", recorded)
    rows = 24
    with use_backend("reference"):
        NativeEngine(model, "decode", eos_token_id=-1).generate([[5]] * rows, list(range(rows)),
                                                                SamplingParams(max_new_tokens, 1.0))
    calls = host_memory.cpu_engine_calls(model.cfg, dtype, engines=1, samples=rows, rollout_chunk=0,
                                         max_new_tokens=max_new_tokens)
    # the bound's KV cache part (its scratch is measured against the whole call below)
    assert calls.rows == rows and held and calls.rows * calls.positions * calls.kv_position_bytes <= held[0]
    # a wave of rollout.chunk rows per engine holds only those; two engines split the step
    assert host_memory.cpu_engine_calls(model.cfg, dtype, 2, 1000, 8, 2).rows == 8
    assert host_memory.cpu_engine_calls(model.cfg, dtype, 2, 1001, 0, 2).rows == 501


class _PeakTensorBytes(TorchDispatchMode):
    """The most bytes of tensor storage alive at once while it is on: every op's outputs counted from the op that made
    their storage until the last tensor on it dies (storages that existed before, `kept`, are not counted). Exact and
    the same on any machine, unlike a process's peak RSS (which agreed: ~72 KB a row of the default model)."""

    def __init__(self, kept):
        super().__init__()
        self.refs = {t.untyped_storage().data_ptr(): 1 << 62 for t in kept}
        self.size, self.now, self.peak = {}, 0, 0

    def _drop(self, ptr):
        self.refs[ptr] -= 1
        if self.refs[ptr] == 0:
            del self.refs[ptr]
            self.now -= self.size.pop(ptr)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor):
                storage = t.untyped_storage()
                ptr = storage.data_ptr()
                if ptr not in self.refs:  # a new storage (a view or an in-place op's output shares its input's)
                    self.refs[ptr], self.size[ptr] = 0, storage.nbytes()
                    self.now += storage.nbytes()
                    self.peak = max(self.peak, self.now)
                self.refs[ptr] += 1
                weakref.finalize(t, self._drop, ptr)
        return out


@pytest.mark.parametrize("dtype, vocab, backend", [("float32", 18, "reference"), ("bfloat16", 18, "reference"),
                                                    ("float32", 4096, "reference"), ("float32", 18, "plain")])
def test_the_engine_call_bound_is_below_what_the_native_engine_holds_at_its_peak(dtype, vocab, backend):
    """Issue 54: the KV cache alone (~1.5 KB a row of the default model) let rollout.n_samples=100000 (1.6 M rows in one
    call) start on a 23.5 GiB host; the call holds ~72 KB a row on the reference kernels (their decode attention's
    fp32 key blocks), ~198 KB with a vocabulary of 4096 (the sampler's [rows, vocab] buffers), ~5 KB on the plain
    kernels. The bound counts the largest working set and the KV cache: below the measured peak, and within a factor
    of two of it on the reference kernels (the ones whose scratch grows that large)."""
    from top_rl.tasks import ArithTask

    rows = 512
    model = tiny_model(dtype, vocab_size=vocab, max_position_embeddings=64)
    with use_backend(backend):
        engine = NativeEngine(model, "decode", eos_token_id=-1)
        with _PeakTensorBytes([*model.parameters(), *model.buffers()]) as peak:
            engine.generate([[5]] * rows, list(range(rows)), SamplingParams(2, 1.0))
    assert peak.now == 0  # every storage the call made was counted back out: the count is whole
    plain = {} if backend == "reference" else {"reference": False}  # the reference kernels: the default
    calls = host_memory.cpu_engine_calls(model.cfg, dtype, engines=1, samples=rows, rollout_chunk=0, max_new_tokens=2,
                                         **plain)
    assert calls.rows == rows and calls.bytes <= peak.peak, (calls.describe(), peak.peak)
    if backend == "reference":
        assert calls.bytes * 2 >= peak.peak, (calls.describe(), peak.peak)
    assert ArithTask().vocab_size == 18  # the default job's model: the shape the first cases measure
