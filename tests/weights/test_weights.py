"""The weights package without Ray: which variant each engine gets from the one setting, the one table of variants,
and a push by the transports rank 0 made at connect reaching each engine bitwise (a gloo broadcast pair in two
threads, the object store), with a failing engine reported by index instead of raised."""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import timedelta
from types import SimpleNamespace

import pytest
import torch

from top_rl.driver import rendezvous
from top_rl.weights import senders
from top_rl.weights.group import Group
from top_rl.weights.native import Broadcast, ObjectStore
from top_rl.weights.sglang_distributed import SglangDistributed
from top_rl.weights.base import WeightRequest
from top_rl.weights.senders import choose, link
from top_rl.weights.transport import Endpoint, Link, Transport, TransportSetting, refusal

CPU, GPU0, GPU1 = Endpoint("n", None), Endpoint("n", "GPU-0"), Endpoint("n", "GPU-1")


def test_each_engine_gets_the_variant_its_placement_allows():
    native = [("auto", CPU, CPU, Transport.object_store), ("auto", GPU0, GPU1, Transport.broadcast),
              ("auto", GPU0, GPU0, Transport.ipc), ("auto", GPU0, CPU, Transport.object_store),
              ("broadcast", CPU, CPU, Transport.broadcast), ("object_store", GPU0, GPU1, Transport.object_store),
              ("ipc", GPU0, GPU0, Transport.ipc)]
    sglang = [("auto", GPU0, GPU0, Transport.sglang_ipc), ("auto", GPU0, GPU1, Transport.sglang_distributed),
              ("auto", CPU, CPU, Transport.sglang_disk), ("ipc", GPU0, GPU0, Transport.sglang_ipc),
              ("broadcast", CPU, CPU, Transport.sglang_distributed), ("disk", GPU0, GPU0, Transport.sglang_disk)]
    assert [choose(s, "native", t, e) for s, t, e, _ in native] == [want for *_, want in native]
    assert [choose(s, "sglang", t, e) for s, t, e, _ in sglang] == [want for *_, want in sglang]
    with pytest.raises(ValueError, match=r"weight_transport=broadcast, but a rollout engine shares trainer rank 0's GPU"):
        choose("broadcast", "sglang", GPU0, GPU0)
    with pytest.raises(ValueError, match=r"weight_transport=broadcast needs the trainer and the engines on the same"):
        choose("broadcast", "native", GPU0, CPU)
    with pytest.raises(ValueError, match=r"weight_transport=ipc, but a rollout engine \(GPU-1\) does not share"):
        choose("ipc", "sglang", GPU0, GPU1)
    with pytest.raises(ValueError, match="nccl"):
        choose("nccl", "native", CPU, CPU)
    assert link("broadcast", CPU, CPU) == Link(Transport.broadcast) and link("auto", CPU, CPU).needs_group is False


def test_a_setting_that_cannot_reach_the_engine_kind_is_refused_naming_the_choices():
    assert refusal("object_store", "sglang") == ("cluster.weight_transport=object_store does not reach a sglang rollout "
                                                 "engine; choose one of ['auto', 'broadcast', 'disk', 'ipc']")
    assert "choose one of ['auto', 'broadcast', 'ipc', 'object_store']" in refusal("disk", "native")
    assert [s for s in TransportSetting if refusal(s, "native") and refusal(s, "sglang")] == []


def test_one_table_holds_every_variant_once():
    assert set(senders.TRANSPORTS) == set(Transport)
    assert all(cls.kind == name for name, cls in senders.TRANSPORTS.items())


def test_the_settings_each_engine_kind_accepts_are_the_ones_its_variants_answer_to():
    """transport.refusal (read by the config, without torch) and the variants' own rules agree."""
    for kind in ("native", "sglang"):
        named = {cls.setting for cls in senders.TRANSPORTS.values() if cls.engine_kind == kind}
        assert {s for s in TransportSetting if refusal(s, kind) is None} == named | {TransportSetting.auto}


class _Loads:
    """An engine's weight protocol that records the one way a native engine has (engine/interface.py)."""

    def __init__(self):
        self.loaded = {}

    def load_named_tensors(self, named, version=None):
        self.loaded.update(named)


def test_an_engine_refuses_a_way_in_it_does_not_have_naming_the_ways_it_has():
    from top_rl.engine.interface import WeightWayUnsupported
    from top_rl.rollout.native.engine import NativeEngine
    from top_rl.rollout.sglang.engine import SglangEngine

    assert NativeEngine.weight_ways() == ["load_named_tensors"]
    assert SglangEngine.weight_ways() == list(SglangEngine.WAYS)
    engine = NativeEngine.__new__(NativeEngine)
    with pytest.raises(WeightWayUnsupported, match="NativeEngine has no receive_bucket: it takes weights by "
                                                   "load_named_tensors"):
        engine.receive_bucket(["w"], ["float32"], [[1]])


def _named():
    g = torch.Generator().manual_seed(0)
    return [("model.embed_tokens.weight", torch.randn(7, 5, generator=g)),
            ("model.layers.0.mlp.up_proj.weight", torch.randn(3, 5, generator=g).to(torch.bfloat16)),
            ("model.norm.weight", torch.randn(5, generator=g)),
            ("lm_head.weight", torch.randn(9, 5, generator=g).to(torch.bfloat16))]


class _Engine:
    """An engine actor's handle: `.receive_weights.remote(request)` runs the actor's end of the link on a thread."""

    def __init__(self, pool, receiver, fail=False):
        self.pool, self.receiver, self.fail, self.got = pool, receiver, fail, None
        self.receive_weights = SimpleNamespace(remote=lambda request: pool.submit(self._receive, request))

    def _receive(self, request: WeightRequest):
        if self.fail:
            raise RuntimeError("engine   died\n mid-receive")
        engine = _Loads()
        version = self.receiver.receive(engine, request)  # what EngineActor.receive_weights runs
        self.got = (engine.loaded, version)
        return version


def _pair():
    """Rank 0's and the engine's ends of one broadcast group over gloo on loopback."""
    port = rendezvous.reserve("127.0.0.1")
    t = timedelta(seconds=60)
    ends = {}
    engine = threading.Thread(target=lambda: ends.update(
        one=Group(rendezvous.store("127.0.0.1", port, 2, 1, t), 1, 2, "w")))
    engine.start()
    zero = Group(rendezvous.store("127.0.0.1", port, 2, 0, t), 0, 2, "w")
    engine.join()
    return zero, ends["one"]


def test_a_push_reaches_every_engine_bitwise_and_a_failure_is_reported_by_index(monkeypatch):
    import ray

    monkeypatch.setattr(ray, "get", lambda f: f.result() if isinstance(f, Future) else f)  # a Future: a call's answer
    monkeypatch.setattr(ray, "put", lambda x: x)
    named = _named()
    with ThreadPoolExecutor(4) as pool:
        zero, one = _pair()
        by_group = _Engine(pool, Broadcast(None, Link(Transport.broadcast), one))  # the engine's end holds its group
        store_end = ObjectStore.join(Link(Transport.object_store), _Loads())
        by_store, dead = _Engine(pool, store_end), _Engine(pool, store_end, fail=True)
        chosen = [(0, Broadcast(by_group, Link(Transport.broadcast), zero)),
                  (1, ObjectStore(by_store, Link(Transport.object_store))),
                  (2, ObjectStore(dead, Link(Transport.object_store)))]
        results = senders.push(chosen, named, 7, bucket_bytes=64)  # several buckets, mixed dtypes
    assert results == [(0, None), (1, None), (2, "engine died mid-receive")]
    for engine in (by_group, by_store):
        got, version = engine.got
        assert version == 7 and sorted(got) == sorted(n for n, _ in named)
        for n, t in named:
            assert got[n].dtype == t.dtype and torch.equal(got[n], t), n


def test_sglang_distributed_posts_each_bucket_before_its_broadcast_and_reports_a_failed_server(monkeypatch):
    events = []
    import ray

    from top_rl.weights import sglang_distributed

    monkeypatch.setattr(ray, "get", lambda f: f.result())
    monkeypatch.setattr(sglang_distributed, "broadcast_bucket",
                        lambda bucket, group, flattened: events.append(("bcast", [n for n, _ in bucket], flattened)))

    def receive(request: WeightRequest):
        assert request.transport == Transport.sglang_distributed and request.version == 5
        events.append(("post", request.payload["names"], request.last))
        f = Future()
        if not request.last:
            f.set_result(None)
        else:
            f.set_exception(RuntimeError("server refused the last bucket"))
        return f

    engine = SimpleNamespace(receive_weights=SimpleNamespace(remote=receive))
    link = Link(Transport.sglang_distributed, 1, "gloo", flattened=False)
    results = senders.push([(3, SglangDistributed(engine, link, None))], _named(), 5, bucket_bytes=64)
    assert results == [(3, "server refused the last bucket")]
    posts = [e for e in events if e[0] == "post"]
    assert len(posts) > 1 and [last for *_, last in posts] == [False] * (len(posts) - 1) + [True]
    assert [e[0] for e in events] == ["post", "bcast"] * len(posts)
    assert all(e[2] is False for e in events if e[0] == "bcast")


def test_an_sglang_engines_link_comes_from_the_setting_and_the_engines_own_config():
    from top_rl.rollout.sglang.plan import config_from_dict

    def link_of(sglang: dict, setting="auto", trainer=CPU, engine=CPU):  # the engine's server config as preflight plans it
        return link(setting, trainer, engine, config_from_dict(sglang, 1, model_path="/m", attention_backend="fa3",
                                                              logprob_source="prefill", top=True))

    name = "top_rl_weight_sync"  # rollout.sglang.weight_group_name's default
    assert link_of({}) == Link(Transport.sglang_disk, 1, "gloo", True, name)  # CPU: no CUDA IPC
    assert link_of({}, trainer=GPU0, engine=GPU0) == Link(Transport.sglang_ipc, 1, "nccl", True, name)
    assert link_of({}, "broadcast") == Link(Transport.sglang_distributed, 1, "gloo", True, name)
    assert link_of({"tp_size": 2, "flattened_buckets": False}, trainer=GPU0, engine=GPU1) == \
        Link(Transport.sglang_distributed, 2, "nccl", False, name)
    assert link_of({"weight_group_name": "mine"}, "broadcast").group_name(1, 40001) == "mine_1_40001"  # honoured
    assert link_of({"tp_size": 2}, trainer=GPU0, engine=GPU1).world == 3


def test_the_engines_end_of_sglang_distributed_joins_and_flips_the_version_on_the_last_bucket_only():
    calls = []

    class Server:  # the two ways in SglangDistributed uses (engine/interface.py's EngineWeights)
        def join_weight_group(self, host, port, backend, name):
            calls.append(("join", host, port, backend, name))

        def receive_bucket(self, names, dtypes, shapes, weight_version=None):
            calls.append(("bucket", names, weight_version))

    link, server = Link(Transport.sglang_distributed, 1, "gloo"), Server()
    end = SglangDistributed.join(link, server, "g_0_9", "10.0.0.1", 9, store=None)
    meta = {"names": ["w"], "dtypes": ["float32"], "shapes": [[1]]}
    assert end.receive(server, WeightRequest(Transport.sglang_distributed, 3, meta, last=False)) is None
    assert end.receive(server, WeightRequest(Transport.sglang_distributed, 3, meta)) == 3
    assert calls == [("join", "10.0.0.1", 9, "gloo", "g_0_9"), ("bucket", ["w"], None), ("bucket", ["w"], "3")]


def test_the_object_store_payload_is_host_bytes_that_name_no_module_and_come_back_bitwise():
    """megatron-core swaps torch.storage._load_from_bytes for its own function, so a pickled tensor names
    megatron.core and its reader imports all of it first (~6 s at a run's first push): the object store carries each
    bucket as numpy bytes instead, read back as views of the store's read-only copy."""
    import pickle
    import pickletools

    import megatron.core  # noqa: F401  (its patch of torch.storage, as on every trainer rank)

    from top_rl.weights.base import Outgoing, object_store_named

    named = _named()
    arrays, metas = Outgoing(named, bucket_bytes=64).object_store_payload()
    assert len(arrays) > 1 and all(a.dtype.name == "uint8" for a in arrays)
    pickled = pickle.dumps((arrays, metas), protocol=5)
    modules = {arg.split()[0] for op, arg, _ in pickletools.genops(pickled) if isinstance(arg, str) and "." in arg}
    assert not any("megatron" in m or "torch" in m for m in modules), modules
    for a in arrays:
        a.flags.writeable = False  # as Ray hands them back (zero-copy)
    got = object_store_named((arrays, metas))
    assert sorted(got) == sorted(n for n, _ in named)
    for n, t in named:
        assert got[n].dtype == t.dtype and torch.equal(got[n], t), n
    # and the check above can fail: a tensor pickled here names megatron-core's loader
    assert b"megatron" in pickle.dumps(named[0][1])
