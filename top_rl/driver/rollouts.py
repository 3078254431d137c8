"""A run's rollouts as the schedule (top_rl.driver.schedule) draws them: prompts from the data position the last one
left, submitted to the engines under the weights they hold, collected and checked against the weight version the
schedule expects. The driver holds no weights: a rollout is a pure function of prompts, seeds and weights, which is
why a resume can generate one again."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from top_rl.rl import dynamic_sampling, versions
from top_rl.engine.interface import SamplingParams, sample_seed
from top_rl.tasks import prompts


class StepRollout:
    """A step's rollout: its prompts' items (one per sample), their counts, the submitted call, the data position it
    was drawn from (`start`) and the one after it (`position`). `round_`: dynamic sampling's extra round of the step
    (0: the step's own rollout, its ordinary seeds)."""

    def __init__(self, cluster, task, cfg, step: int, position, max_prompt_len: int, params, round_=0):
        n = cfg.rollout.n_samples
        self.step, self.round_, self.start = step, round_, position
        items, self.position, self.prompt_counts = prompts.next_prompts(
            task, cfg.rollout.prompts_per_step, cfg.seed, position, max_prompt_len, cfg.rollout.on_long_prompt)
        self.group_items = [it for it in items for _ in range(n)]  # sample i belongs to prompt i // n
        batch = len(self.group_items)
        self.pending = cluster.submit_generate(
            [it.prompt_ids for it in self.group_items],
            [sample_seed(cfg.seed, step, dynamic_sampling.round_index(round_, i, batch)) for i in range(batch)], params)


@dataclass
class Collected:
    """A collected rollout and what its collection measured: the weight version every sample was generated under
    (checked), the seconds the driver waited for it, the seconds of it hidden behind a trainer step (`overlap`), the
    engines' own rollout metrics, and the version the batch names to the trainer (`stamp`: None synchronously, where
    it is the trainer's own)."""

    rollout: StepRollout
    samples: list
    behaviour: int
    seconds: float
    overlap: float = 0.0
    engine_metrics: dict = field(default_factory=dict)
    stamp: int | None = None


class RolloutSource:
    """Draws and submits rollouts in data order (`position`: where the next is drawn from) and collects them."""

    def __init__(self, cluster, task, cfg, position, max_prompt_len: int):
        self.cluster, self.task, self.cfg, self.position = cluster, task, cfg, position
        self.max_prompt_len = max_prompt_len
        self.params = SamplingParams(cfg.rollout.max_new_tokens, cfg.rollout.temperature, (task.eos_token_id,))

    def submit(self, step: int, round_: int = 0) -> StepRollout:
        """Step `step`'s rollout (0-based; `round_`: a dynamic-sampling round), generating under the engines'
        weights from now on; the data position moves past its prompts."""
        rollout = StepRollout(self.cluster, self.task, self.cfg, step, self.position, self.max_prompt_len,
                              self.params, round_)
        self.position = rollout.position
        return rollout

    def samples(self, rollout: StepRollout, expected: int) -> list:
        """The rollout's samples, each generated under weight version `expected` (else VersionMismatch)."""
        got = self.cluster.collect(rollout.pending)
        versions.check_batch([s.weight_version for s in got], rollout.pending.version, rollout.step + 1)
        if rollout.pending.version != expected:  # the schedule's own order, checked: never trained past
            what = f"dynamic sampling's round {rollout.round_}" if rollout.round_ else "the rollout"
            raise versions.VersionMismatch(f"weight version check at step {rollout.step + 1}: {what} was submitted "
                                           f"under weight version {rollout.pending.version}, expected version "
                                           f"{expected}", rollout.step + 1)
        return got

    def collect(self, rollout: StepRollout, expected: int, stamp: bool, overlap: bool) -> Collected:
        """`samples`, with what the collection measured. `overlap`: ask the engines how much of it ran behind the
        trainer's step (a lagged schedule; before the next rollout starts); `stamp`: the batch names its version."""
        t0 = time.perf_counter()
        got = self.samples(rollout, expected)
        seconds = time.perf_counter() - t0
        # the engines' generate time (the slowest engine's, over its waves) less the time the driver waited for it
        hidden = max(0.0, self.cluster.generate_seconds() - rollout.pending.waited_s) if overlap else 0.0
        return Collected(rollout, got, expected, seconds, hidden, self.cluster.rollout_metrics(),
                         expected if stamp else None)
