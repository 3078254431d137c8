"""Weight-sync payloads: buckets, the flattened layout (checked against SGLang's own FlattenedTensorBucket), and
the IPC variant (top_rl.weights.sglang_ipc: rank 0 serialises, the engine posts) end to end against the in-thread
STAND-IN server (same process: the payload's shared-memory handles resolve there; on a GPU they are CUDA IPC
handles into trainer rank 0's memory, tests/gpu/test_sglang_live.py)."""

from __future__ import annotations


import pytest
import torch

from tests import sglang_cpu
from tests.helpers import push_by_ipc, sglang_engine_config, tiny_model

from top_rl import contract  # noqa: E402
from top_rl.model import hf_state_dict, save_model  # noqa: E402
from top_rl.engine.interface import SamplingParams  # noqa: E402
from top_rl.rollout.native.engine import NativeEngine  # noqa: E402
from top_rl.rollout.sglang.engine import SglangEngine  # noqa: E402
from top_rl.weights import buckets as W  # noqa: E402
from top_rl.weights.sglang_distributed import sync_distributed  # noqa: E402
from tests.doubles.sglang_standin import StandinServer  # noqa: E402

V1 = contract.DEFAULT  # the contract these engines run under

_ERR = sglang_cpu.import_error()
needs_sglang = pytest.mark.skipif(_ERR is not None, reason=_ERR or "")


def _named():
    return [("a", torch.arange(6, dtype=torch.float32).reshape(2, 3)), ("b", torch.ones(5, dtype=torch.bfloat16)),
            ("c", torch.full((4, 4), 2.5, dtype=torch.float32)), ("d", torch.zeros(1, dtype=torch.bfloat16))]


def test_buckets_keep_order_and_size():
    named = _named()
    bks = W.buckets(named, bucket_bytes=40)
    assert [[n for n, _ in b] for b in bks] == [["a", "b"], ["c"], ["d"]]  # c (64 bytes) travels alone
    assert [n for b in bks for n, _ in b] == [n for n, _ in named]
    assert W.bucket_meta(bks[0]) == {"names": ["a", "b"], "dtypes": ["float32", "bfloat16"], "shapes": [[2, 3], [5]]}
    assert len(W.buckets(named, 1 << 20)) == 1


@needs_sglang
def test_flatten_is_sglangs_layout():
    from sglang.srt.weight_sync.tensor_bucket import FlattenedTensorBucket

    with pytest.raises(RuntimeError, match="divisible"):  # why buckets() orders by element size
        FlattenedTensorBucket(named_tensors=_named()).reconstruct_tensors()
    named = W.buckets(_named(), 1 << 20)[0]
    assert [n for n, _ in named] == ["a", "c", "b", "d"]
    flat = W.flatten(named)
    assert torch.equal(flat, FlattenedTensorBucket(named_tensors=named).get_flattened_tensor())
    # what the server rebuilds from the metadata the trainer sent
    empties = [(n, torch.empty(s, dtype=getattr(torch, d))) for n, d, s in zip(*W.bucket_meta(named).values())]
    server = FlattenedTensorBucket(named_tensors=empties)
    server.get_flattened_tensor().copy_(flat)
    for (n, t), (m, u) in zip(named, server.reconstruct_tensors()):
        assert n == m and torch.equal(t, u) and t.dtype == u.dtype
    for (n, t), (m, u) in zip(named, W.unflatten(flat, W.bucket_meta(named))):
        assert n == m and torch.equal(t, u)
    with pytest.raises(ValueError, match="metadata describes"):
        W.unflatten(flat[:-1], W.bucket_meta(named))


def test_sync_distributed_orders_post_broadcast_wait():
    events = []

    def post(meta):
        events.append(("post", meta["names"], meta["weight_version"]))
        return lambda: events.append(("wait", meta["names"]))

    n = sync_distributed(_named(), 40, post, lambda b: events.append(("bcast", [k for k, _ in b])), weight_version="7")
    assert n == 3
    assert events[:3] == [("post", ["a", "b"], None), ("bcast", ["a", "b"]), ("wait", ["a", "b"])]
    assert [e[2] for e in events if e[0] == "post"] == [None, None, "7"]  # the version flips with the last bucket


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny_w")
    save_model(tiny_model(), d)
    return d


@needs_sglang
@pytest.mark.parametrize("flattened", [True, False])
def test_ipc_push_end_to_end(ckpt, flattened, monkeypatch):
    other = tiny_model(seed=3)
    with StandinServer(str(ckpt)) as srv:
        cfg = sglang_engine_config(str(ckpt), port=srv.port, flattened_buckets=flattened)
        eng = SglangEngine(cfg, "fa3", top=V1)
        push_by_ipc(monkeypatch, eng, hf_state_dict(other), 4, bucket_bytes=0)
        bodies = [b for p, b in srv.requests if p == "/update_weights_from_tensor"]
        assert len(bodies) == len(hf_state_dict(other))  # bucket_bytes=0: one tensor per bucket
        assert all(len(b["serialized_named_tensors"]) == cfg.tp_size for b in bodies)
        assert {b["load_format"] for b in bodies} == {"flattened_bucket" if flattened else None}
        # only the last bucket flushes and flips the weight version, to the trainer's
        assert [b["weight_version"] for b in bodies] == [None] * (len(bodies) - 1) + ["4"]
        assert [b["flush_cache"] for b in bodies] == [False] * (len(bodies) - 1) + [True]
        params = SamplingParams(max_new_tokens=4, temperature=0.9)
        got = eng.generate([[3, 4, 5]], [7], params)
        want = NativeEngine(other).generate([[3, 4, 5]], [7], params)
        assert got[0].logprobs == want[0].logprobs and got[0].meta["weight_version"] == "4"


@needs_sglang
def test_a_disk_push_of_version_v_makes_the_server_report_v(ckpt, tmp_path, monkeypatch):
    """Issue 54 item 10: SglangDisk's receive loaded without the version, and the engine numbered versions itself: pushing 1
    then 4 (a resumed run, a replaced engine) made the server report '2' while the trainer held 4, as the IPC
    transport does not. Now the server reports the version pushed, and samples carry it."""
    import ray

    from top_rl.weights.base import Outgoing, WeightRequest
    from top_rl.weights.native import SglangDisk

    monkeypatch.setattr(ray, "get", lambda x: x)  # the payload itself, not an object store reference
    from top_rl.weights.transport import Link, Transport

    params = SamplingParams(max_new_tokens=3, temperature=1.0)
    with StandinServer(str(ckpt)) as srv:
        eng = SglangEngine(sglang_engine_config(str(ckpt), port=srv.port, weights_dir=str(tmp_path / "w"),
                                                keep_weight_versions=1), "fa3", top=V1)
        receiver = SglangDisk.join(Link(Transport.sglang_disk), eng)  # the engine actor's end
        for version, seed in ((1, 3), (4, 5)):
            payload = Outgoing(list(hf_state_dict(tiny_model(seed=seed)).items()), 1 << 12).object_store_payload()
            receiver.receive(eng, WeightRequest(Transport.sglang_disk, version, payload))
            got = eng.generate([[3, 4, 5]], [7], params)
            assert got[0].meta["weight_version"] == str(version) and eng.version == version
        assert [b["weight_version"] for p, b in srv.requests if p == "/update_weights_from_disk"] == ["1", "4"]
        assert got[0].logprobs == NativeEngine(tiny_model(seed=5)).generate([[3, 4, 5]], [7], params)[0].logprobs
        assert sorted(p.name for p in (tmp_path / "w").iterdir() if p.name.startswith("v")) == ["v000004"]


@needs_sglang
def test_a_released_server_refuses_until_resumed_and_pushed(ckpt, monkeypatch):
    """cluster.gpu_handoff's engine side against the stand-in (its weights turn to NaN on release, as a real server's
    paused memory holds nothing it can trust): release, resume, then the push restores the trainer's weights."""
    from top_rl.rollout.sglang.client import SglangError

    other = tiny_model(seed=5)
    params = SamplingParams(max_new_tokens=3, temperature=1.0)
    with StandinServer(str(ckpt)) as srv:
        eng = SglangEngine(sglang_engine_config(str(ckpt), port=srv.port), "fa3",
                           top=V1)
        eng.generate([[3, 4, 5]], [7], params)
        eng.release_memory()
        with pytest.raises(SglangError, match=r"has released its GPU memory \(cluster.gpu_handoff\): resume_memory"):
            eng.generate([[3, 4, 5]], [7], params)
        eng.resume_memory()
        with pytest.raises(SglangError, match="sync the trainer's weights again"):  # the weights are gone
            eng.generate([[3, 4, 5]], [7], params)
        push_by_ipc(monkeypatch, eng, hf_state_dict(other), 2, 1 << 20)
        got = eng.generate([[3, 4, 5]], [7], params)
        assert got[0].logprobs == NativeEngine(other).generate([[3, 4, 5]], [7], params)[0].logprobs
        assert srv.scheduler.memory_events == [("release", True), ("resume", True)]
