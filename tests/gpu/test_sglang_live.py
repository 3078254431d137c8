"""A LIVE SGLang server (the contract's release, launched by top_rl's SglangEngine with the contract's flags) against
the trainer's kernels on the same GPU. Skipped unless CUDA, a real `sgl_kernel` and every module the server imports
are importable (the skip names the first missing one: tests/gpu/_common.py `missing_server_module`), i.e. unless the
server's bundle is installed (`scripts/gpu_bundle.sh sglang_live`, two carries; scripts/gpu_run.sh).

The trainer side is `sequence_logprobs` on the `sglang` kernels, which equal the Megatron trainer bit for bit
(tests/gpu/test_model_parity.py, test_trainer_megatron.py). Checked here:
- the gate's prefill source (the server re-scores every sample) bitwise, over prompt lengths 1..300, T = 1.0 and
  0.7, one batch, batches of 5 and one request at a time, and the same tokens whatever the batch;
- after a weight push by each transport (disk, tensors over CUDA IPC, update_weights_from_distributed over a
  process group) the server's log-probs are the new weights' and every answer reports the new weight version;
  NCCL refuses two ranks on one GPU, so on one GPU the distributed push runs over gloo (SGLang's own group helper
  on both ends; the NCCL path needs the trainer on another GPU);
- a killed server is restarted by the engine, re-synced (disk: reloaded; distributed: refused until the trainer
  pushes again) and still bitwise;
- the decode source: the sampler's decode-step log-probs against the tempered recompute, measured for triton and
  flashinfer; a backend where they differ must stay refused by the contract (decode_equals_extend).
Measured numbers go to $TOP_RL_GPU_REPORT (JSON lines; scripts/gpu_run.sh adds them to its summary).
"""

from __future__ import annotations

import functools
import json
import os
import random
import signal
import threading
import time

import pytest
import torch

from top_rl import contract
from top_rl.model import Qwen3, Qwen3Config, hf_state_dict, save_model
from top_rl.model.packing import sequence_logprobs
from top_rl.weights import sglang_distributed
from top_rl.engine.interface import SamplingParams
from top_rl.rollout.sglang.engine import SglangEngine, SglangEngineRestarted
from top_rl.rollout.sglang.config import SglangEngineConfig, TopConfigError, check_logprob_source
from tests.gpu._common import missing_server_module
from tests.helpers import in_thread, push_by_ipc

# The contract these engines run under: the installed release's (contract.fallback, as a run without top.contract
# takes it), so the module proves whichever release the machine holds (issue 33: 0.5.11 and 0.5.17).
V1 = contract.fallback()


def _live_error() -> str | None:
    if not torch.cuda.is_available():
        return "needs CUDA"
    try:
        import sgl_kernel  # noqa: F401  (the real one: the server's kernels)
        import sglang
    except Exception as e:  # noqa: BLE001
        return f"no live SGLang here ({type(e).__name__}: {e}): carry scripts/gpu_bundle.sh sglang_live"
    if sglang.__version__ not in contract.RELEASE_DEFAULTS:
        return (f"sglang {sglang.__version__} has no TOP contract (the releases with one: "
                f"{', '.join(contract.RELEASE_DEFAULTS)})")
    return None


_ERR = _live_error()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(_ERR is not None, reason=_ERR or "")]


def _skip_unless_a_server_can_start(backend: str) -> None:
    """Issue 30: with sglang and sgl_kernel importable but the server's other dependencies absent, every live test
    errored at setup with "server exited with code 1". Checked first (in a child process, as the server imports them),
    the missing module is named in the skip."""
    missing = missing_server_module(backend)
    if missing is not None:
        pytest.skip(f"a live SGLang server ({backend} attention) cannot start here: {missing[0]} is missing "
                    f"({missing[1]}); carry scripts/gpu_bundle.sh sglang_live (scripts/gpu_run.sh)")


@pytest.fixture(scope="module", autouse=True)
def server_can_start():
    _skip_unless_a_server_can_start("triton")

# Qwen3-0.6B's width (hidden 1024, 16/8 heads of 128, vocab 151936), 8 layers so the server starts quickly.
ARCH = Qwen3Config(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=8,
                   num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=1024,
                   tie_word_embeddings=True, rope_theta=1e6, torch_dtype="bfloat16", eos_token_id=151645)
NEW_TOKENS = 48


def _report(**row) -> None:
    path = os.environ.get("TOP_RL_GPU_REPORT")
    line = json.dumps({"test": "sglang_live", **row})
    print(line)
    if path:
        with open(path, "a") as f:
            f.write(line + "\n")


def _model(seed: int) -> Qwen3:
    return Qwen3(ARCH, "bfloat16").init_random(seed).cuda()


def _prompts(n: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    lengths = [1, 2, 300, 8, 199] + [rng.randint(3, 260) for _ in range(n - 5)]
    return [[rng.randrange(3, 151643) for _ in range(k)] for k in lengths[:n]]


def _free_port() -> int:
    from top_rl.rollout.sglang.config import free_port

    return free_port()


def _start(tmp, backend: str, model_seed: int = 0, **kw) -> tuple[SglangEngine, Qwen3]:
    model = _model(model_seed)
    ckpt = tmp / f"ckpt_{backend}"
    save_model(model, ckpt)
    cfg = SglangEngineConfig(model_path=str(ckpt), attention_backend=backend, logprob_source="prefill", top=True,
                             port=_free_port(), mem_fraction_static=0.3, weights_dir=str(tmp / f"weights_{backend}"),
                             log_path=str(tmp / f"server_{backend}.log"), startup_timeout_s=420,
                             cuda_graph_max_bs=64, **kw)
    eng = SglangEngine(cfg, backend, top=V1)
    t0 = time.monotonic()
    eng.start()
    _report(event="server_up", backend=backend, seconds=round(time.monotonic() - t0, 1))
    return eng, model


@pytest.fixture(scope="module")
def triton_server(tmp_path_factory):
    eng, model = _start(tmp_path_factory.mktemp("live"), "triton")
    try:
        yield eng, model
    finally:
        eng.shutdown()


def _recompute(model, samples, temperature=None) -> list[torch.Tensor]:
    """The trainer's numbers for each sample: prefill (fp32, untempered) or, with a temperature, the sampler's."""
    with torch.inference_mode():
        return [sequence_logprobs(model, [s.prompt_ids + s.response_ids], [len(s.prompt_ids)], temperature)[0].cpu()
                for s in samples]


def _equal_rows(values: list[list[float]], want: list[torch.Tensor]) -> tuple[int, int]:
    """(equal tokens, tokens) between the engine's floats and the recompute (exact: fp32 survives JSON)."""
    eq = n = 0
    for v, w in zip(values, want):
        got = torch.tensor(v, dtype=torch.float32)
        eq += int((got == w).sum()) if got.shape == w.shape else 0
        n += w.numel()
    return eq, n


def _gate_bitwise(eng, model, prompts, seeds, temperature, batch: int = 0):
    eng.cfg = eng.cfg.replace(request_batch_size=batch)  # the engine config is frozen
    samples = eng.generate(prompts, seeds, SamplingParams(NEW_TOKENS, temperature))
    want = _recompute(model, samples)
    for i, (s, w) in enumerate(zip(samples, want)):
        assert torch.equal(torch.tensor(s.logprobs, dtype=torch.float32), w), \
            f"sample {i} (prompt {len(s.prompt_ids)} tokens, batch {batch or 'all'}, T={temperature}): prefill " \
            f"log-probs differ from the trainer's at {int((torch.tensor(s.logprobs) != w).sum())} tokens"
    return samples


def test_prefill_source_is_bitwise_over_lengths_batches_and_temperatures(triton_server):
    eng, model = triton_server
    prompts, seeds = _prompts(32, 1), [1000 + i for i in range(32)]
    for temperature in (1.0, 0.7):
        whole = _gate_bitwise(eng, model, prompts, seeds, temperature)
        fives = _gate_bitwise(eng, model, prompts, seeds, temperature, batch=5)
        alone = _gate_bitwise(eng, model, prompts[:4], seeds[:4], temperature, batch=1)
        assert [s.response_ids for s in whole] == [s.response_ids for s in fives]
        assert [s.response_ids for s in whole[:4]] == [s.response_ids for s in alone]
        assert [s.sample_logprobs for s in whole] == [s.sample_logprobs for s in fives]
        tokens = sum(len(s.response_ids) for s in whole)
        _report(check="prefill_bitwise", backend="triton", temperature=temperature, samples=len(whole),
                tokens=tokens, equal=tokens)


def test_native_engine_samples_the_live_servers_tokens(triton_server):
    """Issue 23: the native engine (sglang kernels, triton attention, its CUDA-graph decode step) chooses every token as
    the live server does (SGLang's rl-mode sampler: seeded_sampler.py) for the same weights, prompts, seeds and T."""
    from top_rl.rollout.native.engine import NativeEngine

    eng, model = triton_server
    _push(eng, "disk", model)  # the fixture's weights (other tests push others)
    native = NativeEngine(model, "decode", eos_token_id=ARCH.eos_token_id)
    prompts, seeds = _prompts(32, 6), [5000 + i for i in range(32)]
    for temperature in (1.0, 0.7):
        params = SamplingParams(NEW_TOKENS, temperature, (ARCH.eos_token_id,))
        eng.cfg = eng.cfg.replace(request_batch_size=0)  # the engine config is frozen
        server = eng.generate(prompts, seeds, params)
        with torch.inference_mode():
            ours = native.generate(prompts, seeds, params)
        same = [a.response_ids == b.response_ids for a, b in zip(server, ours)]
        eq, n = _equal_rows([s.sample_logprobs for s in server],
                            [torch.tensor(s.sample_logprobs, dtype=torch.float32) for s in ours])
        _report(check="native_vs_server_tokens", temperature=temperature, samples=len(same), same_tokens=sum(same),
                tokens=sum(len(s.response_ids) for s in server), equal_sampler_logprobs=eq, logprob_tokens=n)
        first = same.index(False) if not all(same) else None
        assert all(same), f"T={temperature}: {same.count(False)} of {len(same)} samples differ from the server's; " \
                          f"first: sample {first} (server {server[first].response_ids[:8]}..., native " \
                          f"{ours[first].response_ids[:8]}...)"
        assert eq == n, f"T={temperature}: {n - eq} of {n} sampler log-probs differ from the server's"


def _push_distributed(eng, sd) -> None:
    """This process is the trainer's rank 0, the server rank 1, over gloo (NCCL refuses two ranks on one GPU)."""
    import torch.distributed as dist

    port, joined = _free_port(), {}
    name = f"top_rl_live_{port}"
    t = threading.Thread(target=lambda: joined.update(r=eng.join_weight_group("127.0.0.1", port, "gloo", name)))
    t.start()
    group = sglang_distributed.init_trainer_group("127.0.0.1", port, 2, name, backend="gloo")
    t.join()
    assert eng.weights.group == name, joined
    try:  # SglangDistributed's two ends without Ray: each bucket's receive on a thread, then rank 0's broadcast
        version = str(eng.version + 1)
        sglang_distributed.sync_distributed(
            sd.items(), 512 << 20, lambda meta: in_thread(eng.receive_bucket, meta),
            functools.partial(sglang_distributed.broadcast_bucket, group=group, flattened=eng.cfg.flattened_buckets),
            weight_version=version)
    finally:
        eng.leave_weight_group()
        dist.destroy_process_group(group)


def _push(eng, transport: str, model, monkeypatch=None) -> None:
    sd = hf_state_dict(model)
    if transport == "distributed":
        _push_distributed(eng, sd)
    elif transport == "tensor":  # CUDA IPC handles of rank 0's flat buckets (top_rl.weights.sglang_ipc)
        push_by_ipc(monkeypatch, eng, {k: v.cuda() for k, v in sd.items()}, eng.version + 1, 512 << 20)
    else:  # disk: written next to the server and reloaded
        eng.load_named_tensors(sd)


@pytest.mark.parametrize("transport", ["disk", "tensor", "distributed"])
def test_weight_push_by_each_transport_is_bitwise_and_versioned(triton_server, transport, monkeypatch):
    eng, _ = triton_server
    if transport == "tensor":  # SglangIpc waits on the engine actor's answer with ray.get (tests/helpers.push_by_ipc)
        pytest.importorskip("ray", reason="the CUDA IPC push is a Ray call: carry .gpu_bundle/ray (scripts/gpu_bundle.sh)")
    new = _model({"disk": 11, "tensor": 12, "distributed": 13}[transport])
    before = eng.version
    t0 = time.monotonic()
    _push(eng, transport, new, monkeypatch)
    seconds = time.monotonic() - t0
    assert eng.version == before + 1
    prompts, seeds = _prompts(12, 2), [7 + i for i in range(12)]
    samples = _gate_bitwise(eng, new, prompts, seeds, 1.0)
    assert {s.meta.get("weight_version") for s in samples} == {str(eng.version)}
    _report(check="weight_push", transport=transport, version=eng.version, seconds=round(seconds, 2),
            weights_mb=round(sum(t.numel() * t.element_size() for t in hf_state_dict(new).values()) / 2**20))


def _kill(eng) -> None:
    os.killpg(eng.server.proc.pid, signal.SIGKILL)
    eng.server.proc.wait()


def test_killed_server_is_restarted_resynced_and_bitwise(triton_server):
    eng, _ = triton_server
    eng.cfg = eng.cfg.replace(restart_on_failure=True)  # the engine config is frozen
    prompts, seeds = _prompts(8, 3), [50 + i for i in range(8)]
    disk_model = _model(21)
    _push(eng, "disk", disk_model)
    before = _gate_bitwise(eng, disk_model, prompts, seeds, 0.7)
    _kill(eng)
    t0 = time.monotonic()
    after = _gate_bitwise(eng, disk_model, prompts, seeds, 0.7)  # restarts, reloads the last disk version, retries
    _report(check="restart", transport="disk", seconds=round(time.monotonic() - t0, 1), starts=eng.server.starts)
    assert eng.server.starts == 2
    assert [(s.response_ids, s.logprobs) for s in before] == [(s.response_ids, s.logprobs) for s in after]

    dist_model = _model(22)
    _push(eng, "distributed", dist_model)
    _kill(eng)
    with pytest.raises(SglangEngineRestarted, match="sync the trainer's weights again"):
        eng.generate(prompts, seeds, SamplingParams(NEW_TOKENS, 0.7))  # broadcast weights cannot be replayed
    _push(eng, "distributed", dist_model)  # the trainer re-syncs
    _gate_bitwise(eng, dist_model, prompts, seeds, 0.7)
    assert eng.server.starts == 3


def _decode_rate(eng, model, backend: str) -> float:
    prompts, seeds = _prompts(16, 4), [300 + i for i in range(16)]
    eng.cfg = eng.cfg.replace(request_batch_size=0)  # the engine config is frozen
    samples = eng.generate(prompts, seeds, SamplingParams(NEW_TOKENS, 0.7))
    eq, n = _equal_rows([s.sample_logprobs for s in samples], _recompute(model, samples, 0.7))
    _report(check="decode_vs_extend", backend=backend, equal=eq, tokens=n, rate=round(eq / n, 4))
    return eq / n


def _assert_decode_refusal_matches(backend: str, rate: float) -> None:
    proven = backend in V1.decode_equals_extend
    if rate < 1.0:
        assert not proven, f"the contract lists {backend} in decode_equals_extend, but {rate:.4f} of its tokens agree"
        with pytest.raises(TopConfigError, match="logprob_source='decode'"):
            check_logprob_source(SglangEngineConfig(model_path="/m", attention_backend=backend, logprob_source="decode",
                                                    top=True),
                                 top=V1)


def test_decode_source_stays_refused_where_decode_differs_from_extend_triton(triton_server):
    eng, model = triton_server
    _push(eng, "disk", model)
    _assert_decode_refusal_matches("triton", _decode_rate(eng, model, "triton"))


def test_flashinfer_server_prefill_bitwise_and_decode_rate(tmp_path):
    from top_rl.kernels.sglang import attention as sglang_attention

    _skip_unless_a_server_can_start("flashinfer")
    previous = sglang_attention.attention_backend()
    sglang_attention.set_attention_backend("flashinfer")  # the trainer side computes with the server's kernel
    eng = None
    try:
        eng, model = _start(tmp_path, "flashinfer")
        prompts, seeds = _prompts(16, 5), [900 + i for i in range(16)]
        samples = _gate_bitwise(eng, model, prompts, seeds, 0.7)
        _report(check="prefill_bitwise", backend="flashinfer", temperature=0.7, samples=len(samples),
                tokens=sum(len(s.response_ids) for s in samples))
        _assert_decode_refusal_matches("flashinfer", _decode_rate(eng, model, "flashinfer"))
    finally:
        if eng is not None:
            eng.shutdown()
        sglang_attention.set_attention_backend(previous)
