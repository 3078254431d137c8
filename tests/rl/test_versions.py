"""The driver's weight version check (top_rl.rl.versions): a batch not of the version the step expects is refused,
naming the versions, before the trainer sees it."""

import pytest

from top_rl.loop import behaviour_version
from top_rl.rl.gate import ParityViolation
from top_rl.rl.versions import VersionMismatch, check_batch


def test_a_batch_of_the_expected_version_passes():
    assert check_batch([4, 4, 4], 4, 5) == 4


def test_a_batch_from_a_later_push_is_refused_naming_both_versions():
    """An engine that took version 5 before the rollout submitted under 4 was collected (a push out of order)."""
    with pytest.raises(VersionMismatch, match=r"weight version check at step 5: the rollout was generated under "
                                              r"weight version 5, expected version 4 \(1 of 3 samples; first: sample 2"):
        check_batch([4, 4, 5], 4, 5)


def test_samples_without_a_version_or_of_several_versions_are_refused():
    with pytest.raises(VersionMismatch, match=r"under weight version 3, None, expected version 4 \(2 of 3"):
        check_batch([4, 3, None], 4, 2)
    assert issubclass(VersionMismatch, ParityViolation)  # it stops the run as a parity failure does (one line)


def test_the_loop_expects_one_version_behind_the_trainer_with_a_lag():
    assert [behaviour_version(k, 0) for k in range(4)] == [1, 2, 3, 4]  # the trainer's own version, synchronously
    assert [behaviour_version(k, 1) for k in range(4)] == [1, 1, 2, 3]  # the first batch has no older version
