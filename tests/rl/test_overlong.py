"""DAPO's overlong reward shaping (top_rl/rl/overlong.py): the penalty curve of the paper's eq. 13, point by point."""

import pytest

from top_rl.rl import overlong


def test_the_penalty_curve():
    # L_max 20, L_cache 4: 0 up to 16, then -(len - 16) / 4 down to -1 at 20, -1 beyond
    got = [overlong.penalty(n, 20, 4) for n in range(0, 23)]
    assert got[:17] == [0.0] * 17
    assert got[17:21] == [-0.25, -0.5, -0.75, -1.0]
    assert got[21:] == [-1.0, -1.0]


def test_factor_and_shape():
    assert overlong.penalty(19, 20, 4, factor=0.5) == pytest.approx(-0.375)
    assert overlong.penalty(30, 20, 4, factor=0.5) == -0.5
    assert overlong.penalty(2, 2, 2) == -1.0 and overlong.penalty(1, 2, 2) == -0.5  # the ramp may span the whole limit
    assert overlong.shape([1.0, 1.0, 0.0], [10, 18, 20], 20, 4, 1.0) == [1.0, 0.5, -1.0]


def test_refusals_name_the_key():
    assert overlong.errors(4, 1.0, 16) == []
    assert overlong.errors(0, 1.0, 16)[0].startswith("algo.overlong.buffer=0 must be in [1, rollout.max_new_tokens=16]")
    assert overlong.errors(17, 1.0, 16) and overlong.errors(4, -1.0, 16)[0].startswith("algo.overlong.penalty_factor")
