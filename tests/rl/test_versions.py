"""The driver's weight version check (top_rl.rl.versions): a batch not of the version the step expects is refused,
naming the versions, before the trainer sees it."""

import pytest

from top_rl.driver.schedule import SCHEDULES
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


def _behaviour_versions(lag: int, steps: int = 4) -> list[int]:
    return [SCHEDULES[lag].behaviour_version(k) for k in range(steps)]


def test_the_schedule_expects_lag_versions_behind_the_trainer():
    assert _behaviour_versions(0) == [1, 2, 3, 4]  # the trainer's own version, synchronously
    assert _behaviour_versions(1) == [1, 1, 2, 3]  # the first batch has no older version
    assert _behaviour_versions(2) == [1, 1, 1, 2]  # the first two batches have none two versions older
