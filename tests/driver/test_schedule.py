"""The schedules' order (top_rl.driver.schedule) against a recording stand-in of the cluster and the rollout source:
every batch is of the version its lag names, a push never meets a rollout in flight, one rollout is in flight at a
time, and a checkpoint names the first rollout not yet trained."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from top_rl.driver.rollouts import Collected
from top_rl.driver.schedule import SCHEDULES


class _Recorder:
    """Cluster and rollout source in one: rollouts are (step, version submitted under, data position)."""

    def __init__(self):
        self.weight_version, self.in_flight, self.events, self.position = 1, [], [], 0

    def submit(self, step, round_=0):
        rollout = SimpleNamespace(step=step, start=self.position, version=self.weight_version)
        self.position += 1
        self.in_flight.append(rollout)
        assert len(self.in_flight) == 1, "one rollout in flight at a time"
        self.events.append(("submit", step, self.weight_version))
        return rollout

    def collect(self, rollout, expected, stamp, overlap):
        self.in_flight.remove(rollout)
        assert rollout.version == expected, (rollout.step, rollout.version, expected)
        return Collected(rollout, [], expected, 0.0, 0.0, {}, expected if stamp else None)

    def push_weights(self, version):
        assert not self.in_flight, f"push of version {version} while step {self.in_flight[0].step}'s rollout generates"
        self.weight_version = version
        self.events.append(("push", version))

    def rl_step(self, batch):
        self.events.append(("train", batch.step, batch.behaviour))
        return SimpleNamespace(policy_version=batch.version, updated=True)


def _run(lag: int, steps: int, start: int = 0, stop_after: int | None = None):
    rec = _Recorder()
    cfg = SimpleNamespace(steps=steps, cluster=SimpleNamespace(gpu_handoff=False))
    schedule = SCHEDULES[lag](rec, rec, cfg, start)
    if start:
        rec.position = start  # the checkpoint's position stand-in: one rollout per step
        schedule.resume(start)
    trained, saved = [], None
    for step in range(start, steps if stop_after is None else stop_after):
        taken = schedule.take(step)
        assert taken.rollout.step == step
        batch = SimpleNamespace(step=step, behaviour=taken.behaviour, version=schedule.version)
        report = schedule.train(step, batch)
        metrics = schedule.after_step(step, report, taken)
        trained.append((step, taken.behaviour, report.policy_version, metrics.get("train/policy_lag", 0)))
        saved = (schedule.checkpoint_position(), schedule.checkpoint_behaviour(step + 1))
    return trained, saved, rec


@pytest.mark.parametrize("lag", sorted(SCHEDULES))
def test_every_batch_is_lag_versions_behind_and_never_meets_a_push(lag):
    trained, _, rec = _run(lag, 6)
    assert [b for _, b, _, _ in trained] == [max(k + 1 - lag, 1) for k in range(6)]
    assert [v for _, _, v, _ in trained] == [k + 1 for k in range(6)]  # the schedule's versions, one per update
    assert [m for *_, m in trained][lag:] == [lag] * (6 - lag)
    assert [e[1] for e in rec.events if e[0] == "submit"] == list(range(6))  # each step's rollout once, in order
    assert not rec.in_flight


@pytest.mark.parametrize("lag", sorted(SCHEDULES))
def test_a_checkpoint_names_the_first_rollout_not_yet_trained(lag):
    _, (position, behaviour), _ = _run(lag, 6, stop_after=3)
    assert position == 3  # steps 0-2 trained: step 3's rollout is drawn from position 3 again on resume
    assert behaviour == (None if lag == 0 else max(4 - lag, 1))
    resumed, _, rec = _run(lag, 6, start=3)
    straight, _, _ = _run(lag, 6)
    assert resumed == straight[3:]
    assert rec.events[0] == ("push", max(4 - lag, 1))  # the first rollout's version, from the trainer's copy
