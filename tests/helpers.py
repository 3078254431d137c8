"""Small shared builders for tests: tiny random Qwen3 checkpoints and token batches, Triton kernels interpreted."""

from __future__ import annotations

import contextlib
import importlib.util
import random
import sys

import torch

from top_rl.model import Qwen3, Qwen3Config

TINY = dict(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2, head_dim=16,
            max_position_embeddings=256, eos_token_id=2)


def tiny_config(gqa: int = 2, tied: bool = True, **kw) -> Qwen3Config:
    heads = 4
    return Qwen3Config(**{**TINY, **kw}, num_attention_heads=heads, num_key_value_heads=heads // gqa,
                       tie_word_embeddings=tied)


def tiny_model(dtype="float32", seed=0, **kw) -> Qwen3:
    # std 0.2 makes the random model's distributions peaked enough that sampling differences show up.
    return Qwen3(tiny_config(**kw), dtype).init_random(seed, std=0.2)


def random_sequences(n: int, lo: int, hi: int, vocab: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab) for _ in range(rng.randint(lo, hi))] for _ in range(n)]


def set_threads(n: int):
    prev = torch.get_num_threads()
    torch.set_num_threads(n)
    return prev


@contextlib.contextmanager
def interpreted_module(monkeypatch, path: str, name: str):
    """The module at `path` loaded afresh under Triton's CPU interpreter (TRITON_INTERPRET=1: Triton decides at @jit
    time), as `name`, so its kernels run on CPU tensors."""
    import pytest

    pytest.importorskip("triton")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    try:
        yield mod
    finally:
        sys.modules.pop(name, None)


def with_plan(monkeypatch, **changes):
    """This test computes under the installed KernelPlan with `changes` (backend, contract, attention, or fast-path
    switches by name: what top.* sets in a run); the plan before is restored after the test."""
    import dataclasses

    from top_rl import kernels
    from top_rl.kernels import plan

    cur = plan.current()
    switches = {k: changes.pop(k) for k in list(changes) if k in {f.name for f in dataclasses.fields(plan.FastPaths)}}
    new = dataclasses.replace(cur, **changes, fast_paths=dataclasses.replace(cur.fast_paths, **switches))
    monkeypatch.setattr(plan, "_installed", new)
    monkeypatch.setattr(kernels, "_active", kernels._active)  # install() below may switch the backend module
    kernels.install(new)
    return new


def use_backend(name: str):
    """Compute under the installed KernelPlan with another backend, for a `with` block (kernels.use_plan restores the
    plan before). A test's switch, not the product's: a run's plan comes from its config (kernels.install)."""
    import dataclasses

    from top_rl import kernels
    from top_rl.kernels import plan

    return kernels.use_plan(dataclasses.replace(plan.current(), backend=name))


def push_by_ipc(monkeypatch, eng, sd: dict, version: int, bucket_bytes: int) -> None:
    """SglangIpc's two ends without Ray: rank 0's send (its payload, kept alive until the answer) straight into the
    engine actor's end of the link (what EngineActor.receive_weights hands each request to)."""
    from types import SimpleNamespace

    import ray

    from top_rl.weights.base import Outgoing
    from top_rl.weights.sglang_ipc import SglangIpc
    from top_rl.weights.transport import Link, Transport

    monkeypatch.setattr(ray, "get", lambda done: done)
    link = Link(Transport.sglang_ipc, eng.cfg.tp_size, None, eng.cfg.flattened_buckets)
    receiver = SglangIpc.join(link, eng)
    handle = SimpleNamespace(receive_weights=SimpleNamespace(remote=lambda request: receiver.receive(eng, request)))
    SglangIpc(handle, link).send(Outgoing(list(sd.items()), bucket_bytes), version)()


def in_thread(fn, meta: dict):
    """Start fn(**meta) on a thread (an SGLang receive returns only after the broadcast the caller makes next); the
    waiter joins it and re-raises its error (what a Ray call on the engine's actor is to trainer rank 0)."""
    import threading

    result: dict = {}

    def run() -> None:
        try:
            result["value"] = fn(**meta)
        except BaseException as e:  # noqa: BLE001 - re-raised by the waiter
            result["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()

    def wait() -> None:
        t.join()
        if "error" in result:
            raise result["error"]
    return wait


def sglang_engine_config(model_path: str = "/m", **settings):
    """An SglangEngineConfig with the four fields an engine takes from the run (model, attention backend, log-prob
    source, TOP on) set as the tests' fa3/prefill/TOP run sets them; `settings` are rollout.sglang keys or overrides."""
    from top_rl.rollout.sglang.config import SglangEngineConfig

    run = dict(attention_backend="fa3", logprob_source="prefill", top=True)
    return SglangEngineConfig(model_path=model_path, **{**run, **settings})
