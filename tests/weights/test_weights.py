"""The weights package without Ray: which transport each engine gets, and a push by the senders rank 0 chose at
connect reaching each engine bitwise (a gloo broadcast pair in two threads, the object store), with a failing
engine reported by index instead of raised."""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import timedelta
from types import SimpleNamespace

import pytest
import torch

from top_rl.driver import rendezvous
from top_rl.weights import receivers, senders
from top_rl.weights.group import Group
from top_rl.weights.transport import Endpoint, Link, Transport, choose, link, sglang_link

CPU, GPU0, GPU1 = Endpoint("n", None), Endpoint("n", "GPU-0"), Endpoint("n", "GPU-1")


def test_each_engine_gets_the_transport_its_placement_allows():
    assert choose("auto", CPU, CPU) == Transport.object_store
    assert choose("auto", GPU0, GPU1) == Transport.broadcast
    assert choose("auto", GPU0, GPU0) == Transport.ipc
    assert choose("auto", GPU0, CPU) == Transport.object_store
    assert choose("broadcast", CPU, CPU) == Transport.broadcast
    assert choose("object_store", GPU0, GPU1) == Transport.object_store
    with pytest.raises(ValueError, match=r"weight_transport=broadcast, but a rollout engine shares trainer rank 0's GPU"):
        choose("broadcast", GPU0, GPU0)
    with pytest.raises(ValueError, match=r"weight_transport=broadcast needs the trainer and the engines on the same"):
        choose("broadcast", GPU0, CPU)
    with pytest.raises(ValueError, match="nccl"):
        choose("nccl", CPU, CPU)
    assert link("broadcast", CPU, CPU) == Link(Transport.broadcast) and link("auto", CPU, CPU).needs_group is False
    assert sglang_link("disk", 1, True, GPU0) == Link(Transport.object_store)
    assert sglang_link("tensor", 1, True, GPU0) == Link(Transport.object_store)
    assert sglang_link("distributed", 2, False, GPU0) == Link(Transport.sglang_distributed, 3, "nccl", False)
    assert sglang_link("distributed", 1, True, CPU).backend == "gloo"
    assert Link(Transport.broadcast).group_name(1, 99) != Link(Transport.sglang_distributed).group_name(1, 99)


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
        self.got = (receivers.receive(transport, payload, self.group), version)
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
    monkeypatch.setattr(senders, "ray", SimpleNamespace(get=lambda f: f.result(), put=lambda x: x))
    named = _named()
    with ThreadPoolExecutor(4) as pool:
        zero, one = _pair()
        by_group = _Engine(pool, group=one)
        by_store, dead = _Engine(pool), _Engine(pool, fail=True)
        chosen = [(0, senders.BroadcastSender(by_group, zero)), (1, senders.ObjectStoreSender(by_store)),
                  (2, senders.ObjectStoreSender(dead))]
        results = senders.push(chosen, named, 7, bucket_bytes=64)  # several buckets, mixed dtypes
    assert results == [(0, None), (1, None), (2, "engine died mid-receive")]
    for engine in (by_group, by_store):
        got, version = engine.got
        assert version == 7 and sorted(got) == sorted(n for n, _ in named)
        for n, t in named:
            assert got[n].dtype == t.dtype and torch.equal(got[n], t), n


def test_sglang_distributed_posts_each_bucket_before_its_broadcast_and_reports_a_failed_server(monkeypatch):
    events = []
    monkeypatch.setattr(senders, "ray", SimpleNamespace(get=lambda f: f.result()))
    monkeypatch.setattr(senders, "broadcast_bucket",
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
    results = senders.push([(3, senders.SglangDistributedSender(engine, None, False))], _named(), 5, bucket_bytes=64)
    assert results == [(3, "server refused the last bucket")]
    posts = [e for e in events if e[0] == "post"]
    assert len(posts) > 1 and [v for *_, v in posts] == [None] * (len(posts) - 1) + ["5"]
    assert [e[0] for e in events] == ["post", "bcast"] * len(posts)
    assert all(e[2] is False for e in events if e[0] == "bcast")


def test_an_sglang_engines_link_comes_from_the_engines_own_config():
    from top_rl.driver.cluster import Cluster

    from top_rl.rollout.sglang_plan import config_from_dict

    def link_of(sglang: dict, trainer=CPU):  # the engine's server config as preflight plans it
        specs = [None, SimpleNamespace(sglang=config_from_dict(sglang, 1))]
        return Cluster._sglang_link(SimpleNamespace(engine_specs=specs, trainer_endpoint=trainer), 1)

    assert link_of({}) == Link(Transport.object_store)  # weight_sync defaults to disk
    assert link_of({"weight_sync": "distributed"}) == Link(Transport.sglang_distributed, 2, "gloo", True)
    assert link_of({"weight_sync": "distributed", "tp_size": 2, "flattened_buckets": False}, GPU0) == \
        Link(Transport.sglang_distributed, 3, "nccl", False)
