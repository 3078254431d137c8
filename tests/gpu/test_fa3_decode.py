"""fa3's decode kernel gives the bits of its extend kernel, against a LIVE SGLang server of the installed release (the
proof behind `decode_equals_extend=("fa3",)` in a contract, and so behind the Hopper default: fa3 with the decode
source, where the gate proves the sampler's own log-probs and no re-score pass runs). Skipped unless CUDA, a real
`sgl_kernel` with its FA3 build (`sgl_kernel.flash_ops`: carry scripts/gpu_bundle.sh fa3) and the server's modules are
importable.

One fa3 server (the contract's flags, decode CUDA graphs up to batch 512 as the GSM8K experiments run them, 1024-token
prefill chunks so that prompts of up to 2,000 tokens are prefilled in chunks), and the trainer side on the `sglang`
kernels with fa3. The sampler's decode-step log-probs (`sample_logprobs`) are compared with the trainer's tempered
recompute of the whole sequence (a prefill) by torch.equal over every token of:
- prompt lengths 1 .. 2,000 (past the chunk), T = 1.0 and 0.7;
- one request of 1, 5, 64 and 512 samples (the decode graphs' batch sizes), the same tokens whatever the batch;
- new weights pushed by CUDA IPC and by update_weights_from_distributed (gloo on one GPU);
- a killed server restarted and re-synced from disk;
- the native engine on fa3 draws the server's tokens with the server's sampler log-probs, token for token.
A case that differs fails the test, naming the sample and the first token; the numbers go to $TOP_RL_GPU_REPORT.
"""

from __future__ import annotations

import dataclasses
import random
import time

import pytest
import torch

from top_rl import contract
from top_rl.model import Qwen3, Qwen3Config, save_model
from top_rl.engine.interface import SamplingParams
from top_rl.rollout.sglang.engine import SglangEngine
from top_rl.rollout.sglang.config import SglangEngineConfig, check_logprob_source
from tests.gpu import test_sglang_live as live
from tests.gpu._common import missing_server_module

INSTALLED = contract.fallback()  # the installed release's contract (as a run without top.contract takes it)
# What this file proves is the kernels, not a contract's list: where the installed release's contract does not list
# fa3 yet, the suite measures the candidate that would (the same contract, fa3 added), so that a release is proven
# before its contract lists fa3 (prove, then list). A run's own check still refuses the unlisted one.
V = INSTALLED if "fa3" in INSTALLED.decode_equals_extend else dataclasses.replace(
    INSTALLED, decode_equals_extend=(*INSTALLED.decode_equals_extend, "fa3"))


def _fa3_error() -> str | None:
    if live._ERR is not None:
        return live._ERR
    try:
        import sgl_kernel.flash_ops  # noqa: F401  (sglang-kernel's FA3 build: 1 GB, its own carry)
    except Exception as e:  # noqa: BLE001
        return f"no FA3 build in sgl_kernel ({type(e).__name__}: {e}): carry scripts/gpu_bundle.sh fa3"
    return None


_ERR = _fa3_error()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(_ERR is not None, reason=_ERR or "")]

# Qwen3-0.6B's width, 8 layers, a context of 4,096 for prompts of up to 2,000 tokens
ARCH = Qwen3Config(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=8,
                   num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=4096,
                   tie_word_embeddings=True, rope_theta=1e6, torch_dtype="bfloat16", eos_token_id=151645)
NEW_TOKENS = 32
CHUNK = 1024
LONG = [1, 2, 17, 255, 256, 1023, 1024, 1025, 1500, 2000]  # around the chunk and the decode split sizes


def _model(seed: int) -> Qwen3:
    return Qwen3(ARCH, "bfloat16").init_random(seed).cuda()


def _prompts(lengths: list[int], seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, 151643) for _ in range(k)] for k in lengths]


@pytest.fixture(scope="module")
def fa3_server(tmp_path_factory):
    from top_rl.kernels.sglang import attention as sglang_attention

    missing = missing_server_module("fa3")
    if missing is not None:
        pytest.skip(f"a live SGLang server cannot start here: {missing[0]} is missing ({missing[1]})")
    tmp = tmp_path_factory.mktemp("fa3")
    model = _model(0)
    save_model(model, tmp / "ckpt")
    cfg = SglangEngineConfig(model_path=str(tmp / "ckpt"), attention_backend="fa3", logprob_source="decode", top=True,
                             port=live._free_port(), mem_fraction_static=0.35, weights_dir=str(tmp / "weights"),
                             log_path=str(tmp / "server.log"), startup_timeout_s=420, cuda_graph_max_bs=512,
                             max_running_requests=512, chunked_prefill_size=CHUNK, restart_on_failure=True)
    check_logprob_source(cfg, top=V)  # the contract lets fa3 serve the decode source (else refused here)
    eng = SglangEngine(cfg, "fa3", top=V)
    t0 = time.monotonic()
    eng.start()
    live._report(event="server_up", backend="fa3", seconds=round(time.monotonic() - t0, 1), contract=V.name,
                 sglang=V.sglang_version, listed_by_installed_contract="fa3" in INSTALLED.decode_equals_extend)
    try:
        yield eng, model
    finally:
        eng.shutdown()


@pytest.fixture(autouse=True)
def fa3_on_the_trainer_side(sglang_backend):
    """The trainer's kernels compute with the server's attention kernel (after the session plan is installed)."""
    from top_rl.kernels.sglang import attention as sglang_attention

    sglang_attention.set_attention_backend("fa3")
    yield


def _decode_equals_extend(eng, model, prompts, seeds, temperature, batch: int, case: str):
    """Generate, then compare every sampled token's decode-step log-prob with the trainer's recompute (torch.equal)."""
    eng.cfg = eng.cfg.replace(request_batch_size=batch)  # the engine config is frozen
    samples = eng.generate(prompts, seeds, SamplingParams(NEW_TOKENS, temperature))
    want = live._recompute(model, samples, temperature)
    eq, n = live._equal_rows([s.sample_logprobs for s in samples], want)
    live._report(check="fa3_decode_vs_extend", case=case, temperature=temperature, batch=batch or len(prompts),
                 samples=len(samples), equal=eq, tokens=n)
    for i, (s, w) in enumerate(zip(samples, want)):
        got = torch.tensor(s.sample_logprobs, dtype=torch.float32)
        if not torch.equal(got, w):
            first = int((got != w).nonzero()[0]) if got.shape == w.shape else -1
            pytest.fail(f"{case}, T={temperature}, batch {batch or 'all'}: sample {i} (prompt {len(s.prompt_ids)} "
                        f"tokens): decode-step log-prob differs from the trainer's extend at token {first} "
                        f"({got[first].item() if first >= 0 else got.shape} vs {w[first].item() if first >= 0 else w.shape}); "
                        f"{n - eq} of {n} tokens differ in all")
    return samples


def test_decode_equals_extend_over_prompt_lengths_past_the_chunk(fa3_server):
    eng, model = fa3_server
    live._push(eng, "disk", model)
    prompts = _prompts(LONG, 1)
    for temperature in (1.0, 0.7):
        _decode_equals_extend(eng, model, prompts, [100 + i for i in range(len(prompts))], temperature, 0, "lengths")


def test_decode_equals_extend_at_batches_1_5_64_512(fa3_server):
    eng, model = fa3_server
    live._push(eng, "disk", model)
    rng = random.Random(2)
    prompts = _prompts([rng.randint(1, 300) for _ in range(512)], 2)
    seeds = [2000 + i for i in range(512)]
    for temperature in (1.0, 0.7):
        whole = _decode_equals_extend(eng, model, prompts, seeds, temperature, 0, "batch512")
        by64 = _decode_equals_extend(eng, model, prompts[:64], seeds[:64], temperature, 0, "batch64")
        by5 = _decode_equals_extend(eng, model, prompts[:5], seeds[:5], temperature, 0, "batch5")
        alone = _decode_equals_extend(eng, model, prompts[:1], seeds[:1], temperature, 0, "batch1")
        for part in (by64, by5, alone):  # batch invariance: the same tokens and numbers whatever the batch
            assert [(s.response_ids, s.sample_logprobs) for s in part] == \
                   [(s.response_ids, s.sample_logprobs) for s in whole[:len(part)]]


@pytest.mark.parametrize("transport", ["tensor", "distributed"])
def test_decode_equals_extend_after_a_push(fa3_server, transport, monkeypatch):
    eng, _ = fa3_server
    if transport == "tensor":
        pytest.importorskip("ray", reason="the CUDA IPC push is a Ray call: carry .gpu_bundle/ray (scripts/gpu_bundle.sh)")
    new = _model({"tensor": 31, "distributed": 32}[transport])
    live._push(eng, transport, new, monkeypatch)
    prompts = _prompts([3, 40, 300, 1100] * 4, 3)
    samples = _decode_equals_extend(eng, new, prompts, [300 + i for i in range(16)], 0.7, 0, f"after_{transport}_push")
    assert {s.meta.get("weight_version") for s in samples} == {str(eng.version)}


def test_decode_equals_extend_after_a_restart(fa3_server):
    eng, _ = fa3_server
    model = _model(41)
    live._push(eng, "disk", model)
    starts = eng.server.starts
    live._kill(eng)
    prompts = _prompts([5, 700, 1500, 64] * 2, 4)
    _decode_equals_extend(eng, model, prompts, [400 + i for i in range(8)], 1.0, 0, "after_restart")
    assert eng.server.starts == starts + 1


def test_native_engine_on_fa3_samples_the_servers_tokens(fa3_server):
    """The native engine (the `sglang` kernels with fa3, its decode step as a CUDA graph) draws every token the live
    fa3 server draws, with the same sampler log-probs, for the same weights, prompts, seeds and T."""
    from top_rl.rollout.native.engine import NativeEngine

    eng, model = fa3_server
    live._push(eng, "disk", model)
    native = NativeEngine(model, "decode", eos_token_id=ARCH.eos_token_id)
    prompts = _prompts([1, 9, 120, 300, 700] + [random.Random(5).randint(2, 200) for _ in range(27)], 5)
    seeds = [5000 + i for i in range(len(prompts))]
    for temperature in (1.0, 0.7):
        params = SamplingParams(NEW_TOKENS, temperature, (ARCH.eos_token_id,))
        eng.cfg = eng.cfg.replace(request_batch_size=0)  # the engine config is frozen
        server = eng.generate(prompts, seeds, params)
        with torch.inference_mode():
            ours = native.generate(prompts, seeds, params)
        same = [a.response_ids == b.response_ids for a, b in zip(server, ours)]
        eq, n = live._equal_rows([s.sample_logprobs for s in server],
                                 [torch.tensor(s.sample_logprobs, dtype=torch.float32) for s in ours])
        live._report(check="fa3_native_vs_server", temperature=temperature, samples=len(same), same_tokens=sum(same),
                     equal_sampler_logprobs=eq, logprob_tokens=n)
        assert all(same), f"T={temperature}: {same.count(False)} of {len(same)} samples differ from the server's"
        assert eq == n, f"T={temperature}: {n - eq} of {n} sampler log-probs differ from the server's"
