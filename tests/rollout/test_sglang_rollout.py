"""A rollout's concurrent requests (top_rl/rollout/sglang/rollout.py): every chunk is generated and then re-scored
on its own, the results come back in sample order whatever order the calls finish in, the progress counts samples
and tokens, the stats say what the re-score added, and a failed call is raised once every call has ended."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest

from top_rl.rollout.sglang.rollout import LoadPoller, Progress, run_chunks


def _gen(r: range):
    time.sleep(0.3 * (12 - r.start) / 12)  # later chunks return first, 0.1 s apart
    return [SimpleNamespace(output_ids=[i] * (i % 3 + 1), index=i) for i in r]


def test_chunks_come_back_in_sample_order_each_rescored_after_its_own_generation():
    events, lock = [], threading.Lock()

    def score(r, gens):
        with lock:
            events.append(r.start)
        return [[float(g.index)] for g in gens]

    progress = Progress(samples=12)
    assert "running" not in progress.snapshot()  # no reading of the server yet
    loads = iter([{"loads": [{"num_running_reqs": 9, "token_usage": 0.5, "gen_throughput": 120.0},
                             {"num_running_reqs": 3, "token_usage": 0.25, "gen_throughput": 30.0}]}] * 3)
    poller = LoadPoller(lambda: next(loads), every_s=0.001, on_load=progress.load)
    chunks = [range(i, min(i + 4, 12)) for i in range(0, 12, 4)]
    gens, scores, stats = run_chunks(chunks, _gen, score, progress, poller)
    assert [g.index for g in gens] == list(range(12)) and scores == [[float(i)] for i in range(12)]
    assert sorted(events) == [0, 4, 8] and events[0] == 8  # the chunk that returned first was re-scored first
    snap = progress.snapshot()
    assert snap["samples_done"] == 12 and snap["tokens"] == sum(i % 3 + 1 for i in range(12))
    assert stats.peak_running_requests == 9 and stats.peak_kv_use == 0.5  # the poller stops when the server does
    assert (snap["running"], snap["engine_tok_s"]) == (0, 0.0)  # idle once its rollout is over
    seen = []
    with LoadPoller(lambda: {"loads": [{"num_running_reqs": 9, "gen_throughput": 120.0},
                                       {"num_running_reqs": 3, "gen_throughput": 30.0}]}, every_s=0.001,
                    on_load=lambda *reading: seen.append(reading)):
        while not seen:
            time.sleep(0.001)
    assert seen[0] == (12, 150.0) and seen[-1] == (0, 0.0)  # each reading summed over the server's ranks, then idle
    assert stats.generate_s > 0 and 0 <= stats.rescore_tail_s <= stats.rescore_s + 0.1
    assert set(stats.metrics()) == {"perf/rollout_generate_s", "perf/rollout_rescore_s", "perf/rollout_rescore_tail_s",
                                    "perf/rollout_peak_running_requests", "perf/rollout_peak_kv_use"}


def test_a_failed_call_is_raised_after_the_others_end():
    ended = []

    def gen(r):
        if r.start == 0:
            raise ConnectionError("server gone")
        time.sleep(0.05)
        ended.append(r.start)
        return _gen(r)

    def no_loads():
        raise OSError("no /v1/loads here")
    with pytest.raises(ConnectionError, match="server gone"):
        run_chunks([range(0, 2), range(2, 4)], gen, None, Progress(samples=4), LoadPoller(no_loads))
    assert ended == [2]


def test_rescore_seconds_are_wall_time_not_a_sum_over_concurrent_chunks():
    from top_rl.rollout.sglang.rollout import union_seconds

    assert union_seconds([]) == 0.0
    assert union_seconds([(0.0, 2.0), (1.0, 3.0), (1.5, 2.5)]) == 3.0  # overlapping: 0..3, not 2 + 2 + 1
    assert union_seconds([(5.0, 6.0), (0.0, 1.0), (0.5, 0.75)]) == 2.0  # disjoint spans add, contained ones do not
