"""A step's batch from its collected rollout: the task's rewards, DAPO's dynamic-sampling fill (extra rounds under the
same weights until every group carries a signal), the overlong shaping, GRPO's advantages, and the RLBatch the trainer
gets. Everything here is a pure function of the samples and the config except the fill's extra rounds, which the
rollout source draws from the data position the last rollout left."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from top_rl.driver.rollouts import Collected, RolloutSource
from top_rl.rl import dynamic_sampling, grpo_advantages, overlong
from top_rl.rl.batch import RLBatch, RLSample
from top_rl.tasks import prompts


@dataclass
class ScoredBatch:
    """The step's samples (in group order), their prompt items, rewards and advantages; the rounds' prompt counts,
    the shaping's metrics (dynamic sampling, overlong) and the seconds the fill's extra rounds took."""

    items: list
    samples: list
    rewards: torch.Tensor
    advantages: torch.Tensor
    prompt_counts: dict
    shaping: dict = field(default_factory=dict)
    fill_seconds: float = 0.0

    def rl_batch(self, cfg, step: int, behaviour_version: int | None) -> RLBatch:
        """What the trainer's RL step gets for 1-based step `step` (top_rl.train.rl_step); `behaviour_version`: the
        version a lagged batch was generated under (None: the trainer's own)."""
        return RLBatch([RLSample.from_rollout(s, float(a), it.uid)
                        for s, a, it in zip(self.samples, self.advantages, self.items)],
                       cfg.rollout.temperature, cfg.rollout.logprob_source, step, cfg.algo.updates_per_rollout,
                       behaviour_version=behaviour_version)


def _fill(source: RolloutSource, cfg, taken: Collected, scores: list[float]):
    """DAPO's dynamic sampling (top_rl/rl/dynamic_sampling.py): the step's batch of groups with a signal, from its
    rollout and as many extra rounds as it takes (each drawn from the data position the last left, under the weights
    the step's rollout was generated with: nothing is pushed in between). Returns the batch and the rounds' prompt
    counts summed."""
    counts = dict(taken.rollout.prompt_counts)

    def draw(round_: int) -> dynamic_sampling.Round:
        extra = source.submit(taken.rollout.step, round_)
        for k, v in extra.prompt_counts.items():
            counts[k] += v
        got = source.samples(extra, taken.behaviour)
        return dynamic_sampling.Round(extra.group_items, got, prompts.rewards(source.task, extra.group_items,
                                                                              [s.response_ids for s in got]))

    filled = dynamic_sampling.fill(dynamic_sampling.Round(taken.rollout.group_items, taken.samples, scores), draw,
                                   cfg.rollout.prompts_per_step, cfg.rollout.n_samples,
                                   cfg.algo.dynamic_sampling.max_rounds)
    return filled, counts


def score(source: RolloutSource, cfg, taken: Collected) -> ScoredBatch:
    """Rewards (after the fill, when algo.dynamic_sampling is on), the overlong shaping (after the filter, which judges
    the task's reward), advantages."""
    task, items, samples, counts = source.task, taken.rollout.group_items, taken.samples, taken.rollout.prompt_counts
    scores = prompts.rewards(task, items, [s.response_ids for s in samples])
    shaping, t0 = {}, time.perf_counter()
    if cfg.algo.dynamic_sampling.enabled:  # off: nothing below runs, the rows are the plain run's
        filled, counts = _fill(source, cfg, taken, scores)
        items, samples, scores = filled.items, filled.samples, filled.scores
        shaping.update(filled.metrics)
    fill_seconds = time.perf_counter() - t0
    ol = cfg.algo.overlong
    if ol.enabled:
        scores, penalties = overlong.shape_with_metrics(scores, [len(s.response_ids) for s in samples],
                                                        cfg.rollout.max_new_tokens, ol.buffer, ol.penalty_factor)
        shaping.update(penalties)
    rewards = torch.tensor(scores)
    return ScoredBatch(items, samples, rewards, grpo_advantages(rewards, cfg.rollout.n_samples, cfg.algo.normalize_std),
                       counts, shaping, fill_seconds)
