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
from top_rl.weights.transport import Endpoint, Link, Transport, TransportSetting, choose, link, refusal

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


def _named():
    g = torch.Generator().manual_seed(0)
    return [("model.embed_tokens.weight", torch.randn(7, 5, generator=g)),
            ("model.layers.0.mlp.up_proj.weight", torch.randn(3, 5, generator=g).to(torch.bfloat16)),
            ("model.norm.weight", torch.randn(5, generator=g)),
            ("lm_head.weight", torch.randn(9, 5, generator=g).to(torch.bfloat16))]


class _Engine:
    """An engine actor's handle: `.receive_weights.remote(...)` runs the engine's receive on a thread."""

    def __init__(self, pool, group=None, fail=False):
        self.pool, self.group, self.fail, self.got = pool, group, fail, None
        self.receive_weights = SimpleNamespace(remote=lambda *a: pool.submit(self._receive, *a))

    def _receive(self, transport, payload, version):
        if self.fail:
            raise RuntimeError("engine   died\n mid-receive")
        loaded = {}
        actor = SimpleNamespace(group=self.group, engine=SimpleNamespace(update_weights=loaded.update))
        senders.TRANSPORTS[transport].receive(actor, payload, version)  # what EngineActor.receive_weights runs
        self.got = (loaded, version)
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

    monkeypatch.setattr(ray, "get", lambda f: f.result())
    monkeypatch.setattr(ray, "put", lambda x: x)
    named = _named()
    with ThreadPoolExecutor(4) as pool:
        zero, one = _pair()
        by_group = _Engine(pool, group=one)
        by_store, dead = _Engine(pool), _Engine(pool, fail=True)
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

    def receive(**meta):
        events.append(("post", meta["names"], meta["weight_version"]))
        f = Future()
        if meta["weight_version"] is None:
            f.set_result(None)
        else:
            f.set_exception(RuntimeError("server refused the last bucket"))
        return f

    engine = SimpleNamespace(sglang_receive_bucket=SimpleNamespace(remote=receive))
    link = Link(Transport.sglang_distributed, 1, "gloo", flattened=False)
    results = senders.push([(3, SglangDistributed(engine, link, None))], _named(), 5, bucket_bytes=64)
    assert results == [(3, "server refused the last bucket")]
    posts = [e for e in events if e[0] == "post"]
    assert len(posts) > 1 and [v for *_, v in posts] == [None] * (len(posts) - 1) + ["5"]
    assert [e[0] for e in events] == ["post", "bcast"] * len(posts)
    assert all(e[2] is False for e in events if e[0] == "bcast")


def test_an_sglang_engines_link_comes_from_the_setting_and_the_engines_own_config():
    from top_rl.rollout.sglang.plan import config_from_dict

    def link_of(sglang: dict, setting="auto", trainer=CPU, engine=CPU):  # the engine's server config as preflight plans it
        return link(setting, trainer, engine, config_from_dict(sglang, 1, model_path="/m", attention_backend="fa3",
                                                              logprob_source="prefill", top=True))

    assert link_of({}) == Link(Transport.sglang_disk, 1, "gloo", True)  # CPU: no CUDA IPC
    assert link_of({}, trainer=GPU0, engine=GPU0) == Link(Transport.sglang_ipc, 1, "nccl", True)
    assert link_of({}, "broadcast") == Link(Transport.sglang_distributed, 1, "gloo", True)
    assert link_of({"tp_size": 2, "flattened_buckets": False}, trainer=GPU0, engine=GPU1) == \
        Link(Transport.sglang_distributed, 2, "nccl", False)
    assert link_of({"tp_size": 2}, trainer=GPU0, engine=GPU1).world == 3
