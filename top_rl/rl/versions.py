"""Weight versions: which policy sampled a batch, checked before the trainer sees it.

A weight version names one policy the trainer pushed: 1 is the initial policy, and step k's update (1-based) makes
version k + 1; the schedule mints them (top_rl.driver.schedule). Every sample carries the version its engine held
when it generated it (RolloutSample.weight_version). Under `rollout.policy_lag=K` the batch step k trains was generated
under version k - K (K updates behind the trainer's version k, or version 1 where nothing is that old); the trainer
proves it against a snapshot of that version's weights (top_rl.train.snapshots).
A batch of any other version (an engine that missed a push, pushes out of order, a repeat under the wrong weights)
is refused here, naming both versions: the gate would catch most of them too, but a batch that happens to match
under the wrong weights must never train as if it came from the right ones.
"""

from __future__ import annotations

from collections.abc import Sequence

from top_rl.rl.gate import ParityViolation


class VersionMismatch(ParityViolation):
    """A batch not generated under the weight version the driver expects (a parity failure: stops the run)."""

    def __init__(self, message: str, step: int):
        super().__init__(message, step, None, "")


def check_batch(versions: Sequence[int | None], expected: int, step: int) -> int:
    """`expected`, once every sample's version is it; else VersionMismatch naming the versions found and the one
    expected, and the first sample that differs. A sample without a version (an engine that reports none) counts as
    a mismatch: its policy is unknown."""
    wrong = [(i, v) for i, v in enumerate(versions) if v != expected]
    if wrong:
        found = sorted({str(v) for _, v in wrong})
        i, v = wrong[0]
        raise VersionMismatch(
            f"weight version check at step {step}: the rollout was generated under weight version "
            f"{', '.join(found)}, expected version {expected} ({len(wrong)} of {len(versions)} samples; first: sample "
            f"{i}, version {v}); an engine missed a weight push or took them out of order, so no update was applied",
            step)
    return expected
