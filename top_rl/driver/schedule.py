"""The rollout order and the policy versions, one class per `rollout.policy_lag` (SCHEDULES).

A policy version names one set of weights: 1 is the initial policy and step k's update (1-based) makes version k + 1.
The schedule mints them (`version`, one counter: the trainer's live weights), the engines stamp every sample with the
version they were last sent (top_rl.rl.versions checks it), and the trainer keeps copies of the versions a lagged batch
still needs, keyed by the same numbers (top_rl.train.snapshots, a ring of `policy_lag`).

Each schedule is straight code for one order, the loop calls the same four things on any of them: `take` the step's
collected rollout, `train` the step's batch, `after_step` (the push, the handoff's return, the step's metrics), and what
a checkpoint keeps (`checkpoint_position`, `checkpoint_behaviour`):

  Synchronous (0)  take: generate the step's rollout under the trainer's version; train; push the new version.
  OneAhead (1)     take: collect the rollout in flight (generated under the version before the trainer's); push the
                   trainer's version, submit the next step's rollout under it, train while it generates.
  TwoAhead (2)     as OneAhead with one collected batch waiting between: the rollout in flight is two steps ahead.

A push never meets a rollout in flight: every order collects before it pushes. A checkpoint keeps the data position of
the first rollout not yet trained and the version it was generated under: a resume pushes that version from the
trainer's copy and generates those rollouts again (a rollout is a pure function of prompts, seeds and weights)."""

from __future__ import annotations

import time

from top_rl.driver.rollouts import Collected, RolloutSource
from top_rl.rl import versions


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


class Schedule:
    """What every order shares: the version counter, the trainer call, the push."""

    lag = 0

    def __init__(self, cluster, source: RolloutSource, cfg, start_step: int):
        self.cluster, self.source, self.steps = cluster, source, cfg.steps
        self.version = start_step + 1  # the trainer's live weights: every completed step updated them once
        self.train_s = self.push_s = 0.0

    @classmethod
    def behaviour_version(cls, step: int) -> int:
        """The version step `step`'s batch (0-based) is generated under: `lag` behind the trainer's, except the first
        steps', which nothing older precedes (version 1, the initial policy)."""
        return max(step + 1 - cls.lag, 1)

    def resume(self, step: int) -> None:
        """Resuming at `step`: the engines get the version its rollout is generated under (the trainer's copy of it)."""
        self.cluster.push_weights(version=self.behaviour_version(step))

    def _push_current(self) -> None:
        """The trainer's live version to the engines, unless they hold it."""
        if self.cluster.weight_version != self.version:
            self.cluster.push_weights(version=self.version)

    def _rl_step(self, batch):
        t = time.perf_counter()
        report = self.cluster.rl_step(batch)
        self.train_s = time.perf_counter() - t
        return report

    def _mint(self, step: int, report) -> None:
        """Step `step`'s update made the next version (none when the gate halted it)."""
        if report.policy_version != self.version:
            raise versions.VersionMismatch(f"weight version check at step {step + 1}: the trainer stepped at version "
                                           f"{report.policy_version}, the schedule's is {self.version}", step + 1)
        self.version += int(report.updated)

    def checkpoint_position(self):
        """Where a resume draws its first rollout: the data position of the first rollout not yet trained."""
        return self.source.position

    def checkpoint_behaviour(self, step: int) -> int | None:
        """The version a resume at `step` pushes first (kept in the checkpoint; None: the trainer's own)."""
        return self.behaviour_version(step)


class Synchronous(Schedule):
    """rollout.policy_lag=0: every stage one call; the batch is the trainer's own version (its training forward is the
    gate's). cluster.gpu_handoff: the servers give their GPU memory to the trainer for its step."""

    lag = 0

    def __init__(self, cluster, source: RolloutSource, cfg, start_step: int):
        super().__init__(cluster, source, cfg, start_step)
        self.handoff, self.handoff_s = cfg.cluster.gpu_handoff, 0.0

    def take(self, step: int) -> Collected:
        return self.source.collect(self.source.submit(step), self.behaviour_version(step), stamp=False, overlap=False)

    def train(self, step: int, batch):
        self.handoff_s = _timed(self.cluster.release_engine_memory) if self.handoff else 0.0
        return self._rl_step(batch)

    def after_step(self, step: int, report, taken: Collected) -> dict:
        if self.handoff:  # ... and take it back, empty: the push below restores their weights
            self.handoff_s += _timed(self.cluster.resume_engine_memory)
        self._mint(step, report)
        push_s = _timed(lambda: self.cluster.push_weights(version=self.version))
        return {"perf/train_time": self.train_s, "perf/weight_push_time": push_s,
                **({"perf/gpu_handoff_time": self.handoff_s} if self.handoff else {})}

    def checkpoint_behaviour(self, step: int) -> int | None:
        return None


class OneAhead(Schedule):
    """rollout.policy_lag=1: step k trains the rollout generated under version k while the engines generate step
    k + 1's under the trainer's version k + 1; the trainer proves each batch against its copy of the version that
    sampled it."""

    lag = 1

    def __init__(self, cluster, source: RolloutSource, cfg, start_step: int):
        super().__init__(cluster, source, cfg, start_step)
        self.in_flight = None  # the next step's rollout, generating while this step trains

    def take(self, step: int) -> Collected:
        rollout, self.in_flight = self.in_flight or self.source.submit(step), None
        return self.source.collect(rollout, self.behaviour_version(step), stamp=True, overlap=True)

    def train(self, step: int, batch):
        # the trainer's version to the engines, now that nothing generates; then the next rollout under it
        self.push_s = _timed(self._push_current)
        if step + 1 < self.steps:
            self.in_flight = self.source.submit(step + 1)
        return self._rl_step(batch)

    def after_step(self, step: int, report, taken: Collected) -> dict:
        self._mint(step, report)
        return {"perf/train_time": self.train_s, "perf/weight_push_time": self.push_s,
                "train/policy_lag": report.policy_version - taken.behaviour,
                "train/behaviour_version": taken.behaviour, "perf/overlap_s": taken.overlap}

    def checkpoint_position(self):
        return self.in_flight.start if self.in_flight else self.source.position


class TwoAhead(OneAhead):
    """rollout.policy_lag=2: step k trains the batch generated under version k - 1 (collected during step k - 1),
    collects step k + 1's (generated under version k), pushes the trainer's k + 1 and submits step k + 2's under it,
    then trains while it generates. One rollout is in flight at a time; the trainer keeps copies of two versions."""

    lag = 2

    def __init__(self, cluster, source: RolloutSource, cfg, start_step: int):
        super().__init__(cluster, source, cfg, start_step)
        self.waiting: Collected | None = None  # the next step's batch, collected

    def take(self, step: int) -> Collected:
        if self.waiting is None:  # the run's first step or a resume's: this step's and the next step's rollouts now
            self.waiting = self.source.collect(self.source.submit(step), self.behaviour_version(step), True, True)
            if step + 1 < self.steps:
                if self.cluster.weight_version != self.behaviour_version(step + 1):
                    self.cluster.push_weights(version=self.behaviour_version(step + 1))
                self.in_flight = self.source.submit(step + 1)
        taken, self.waiting = self.waiting, None
        return taken

    def train(self, step: int, batch):
        if self.in_flight is not None:  # the next step's batch, before the push
            self.waiting = self.source.collect(self.in_flight, self.behaviour_version(step + 1), True, True)
            self.in_flight = None
        self.push_s = _timed(self._push_current)
        if step + 2 < self.steps:
            self.in_flight = self.source.submit(step + 2)
        return self._rl_step(batch)

    def checkpoint_position(self):
        return self.waiting.rollout.start if self.waiting else super().checkpoint_position()


SCHEDULES = {0: Synchronous, 1: OneAhead, 2: TwoAhead}  # by rollout.policy_lag (config.validate allows these)


def for_run(cluster, source: RolloutSource, cfg, start_step: int) -> Schedule:
    """The run's schedule, chosen by rollout.policy_lag."""
    return SCHEDULES[cfg.rollout.policy_lag](cluster, source, cfg, start_step)
