"""DAPO's dynamic sampling (top_rl/rl/dynamic_sampling.py): groups with one reward dropped, the batch refilled from
further rounds in order, the cap on rounds (and the top-up at it), the seeds of the rounds, and the config's
refusals."""

import pytest

from top_rl.rl import dynamic_sampling as ds
from top_rl.engine.interface import sample_seed


def _round(tag, group_scores, n=2):
    """A round whose samples are named (tag, group, i): which group of which round landed where is visible."""
    items, samples, scores = [], [], []
    for g, gs in enumerate(group_scores):
        assert len(gs) == n
        items += [f"{tag}-p{g}"] * n
        samples += [(tag, g, i) for i in range(n)]
        scores += list(gs)
    return ds.Round(items, samples, scores)


def test_groups_with_one_reward_are_dropped_and_refilled_in_order():
    first = _round(0, [(1, 1), (0, 1), (0, 0), (1, 0)])  # groups 1 and 3 carry a signal
    rounds = {1: _round(1, [(0, 0), (0, 0), (1, 0), (1, 1)]), 2: _round(2, [(0, 1), (1, 0), (1, 0), (0, 1)])}
    asked = []

    def draw(r):
        asked.append(r)
        return rounds[r]

    out = ds.fill(first, draw, groups=4, n=2, max_rounds=5)
    assert asked == [1, 2]  # one round short after round 1 (3 groups), full after round 2: no third round
    assert out.items == ["0-p1"] * 2 + ["0-p3"] * 2 + ["1-p2"] * 2 + ["2-p0"] * 2
    assert out.samples[0] == (0, 1, 0) and out.samples[-1] == (2, 0, 1) and out.scores == [0, 1, 1, 0, 1, 0, 0, 1]
    m = out.metrics
    assert m["rollout/dynamic_rounds"] == 2 and m["rollout/dynamic_drawn_groups"] == 12
    assert m["rollout/dynamic_dropped_groups"] == 5 and m["rollout/dynamic_filled_groups"] == 0
    assert m["rollout/dynamic_surplus_groups"] == 3  # round 2's groups 1..3: drawn, with a signal, not needed
    assert m["rollout/dynamic_reward_mean_drawn"] == pytest.approx(11 / 24)  # 4 + 3 + 4 ones of 24 samples


def test_a_full_first_round_draws_nothing_more():
    first = _round(0, [(0, 1), (1, 0)])
    out = ds.fill(first, lambda r: pytest.fail("no extra round needed"), groups=2, n=2, max_rounds=3)
    assert out.samples == first.samples and out.metrics["rollout/dynamic_rounds"] == 0
    assert out.metrics["rollout/dynamic_dropped_groups"] == 0


def test_the_cap_stops_the_rounds_and_tops_up_with_dropped_groups():
    """max_rounds=2: round 0 and two more, then the batch is topped up with the earliest dropped groups (advantage 0),
    so the step trains its usual shape."""
    asked = []

    def draw(r):
        asked.append(r)
        return _round(r, [(1, 1), (0, 1)] if r == 2 else [(0, 0), (1, 1)])

    out = ds.fill(_round(0, [(0, 0), (1, 1)]), draw, groups=2, n=2, max_rounds=2)
    assert asked == [1, 2]
    assert out.items == ["2-p1"] * 2 + ["0-p0"] * 2  # the one signal group, then the first dropped
    m = out.metrics
    assert m["rollout/dynamic_rounds"] == 2 and m["rollout/dynamic_filled_groups"] == 1
    assert m["rollout/dynamic_dropped_groups"] == 5 and m["rollout/dynamic_surplus_groups"] == 0
    none = ds.fill(_round(0, [(0, 0), (1, 1)]), lambda r: pytest.fail("cap 0"), groups=2, n=2, max_rounds=0)
    assert none.items == ["0-p0"] * 2 + ["0-p1"] * 2 and none.metrics["rollout/dynamic_filled_groups"] == 2


def test_round_seeds_are_distinct_and_round_zero_is_the_plain_steps():
    batch, rounds = 6, 4
    seeds = [sample_seed(7, s, ds.round_index(r, i, batch)) for s in range(3) for r in range(rounds) for i in range(batch)]
    assert len(set(seeds)) == len(seeds)
    assert [sample_seed(7, 1, ds.round_index(0, i, batch)) for i in range(batch)] == \
        [sample_seed(7, 1, i) for i in range(batch)]
    # the span the refusal guards is sample_seed's per-step multiplier: the last index of a step is below the next's
    assert sample_seed(0, 1, 0) - sample_seed(0, 0, 0) == ds.SEED_INDEX_SPAN


def test_refusals_name_the_key():
    assert ds.errors(4, 512) == []
    (msg,) = ds.errors(-1, 16)
    assert msg.startswith("algo.dynamic_sampling.max_rounds=-1")
    (msg,) = ds.errors(200, 512)
    assert "max_rounds <= 127" in msg and ds.errors(127, 512) == []
