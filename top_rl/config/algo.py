"""The policy-update algorithm's settings (owned here, plain data, imported by the run config): GRPO
advantages, the PPO-clip loss, and what the TOP gate does on a violation."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum


class LossAgg(StrEnum):
    token_mean = "token_mean"  # DAPO: every token of the step weighs the same
    seq_mean = "seq_mean"  # GRPO: per-sample mean, then mean over samples


class OnViolation(StrEnum):
    halt = "halt"  # stop the run with a report, no update
    warn = "warn"  # log the report and train on the step anyway


class OldLogprobs(StrEnum):
    """PPO's old policy: where the ratio's denominator comes from."""

    rollout = "rollout"  # the sampler's log-probs the engine reported (under TOP: proven equal to the trainer's)
    recompute = "recompute"  # one forward-only pass of the trainer before the update (verl's and slime's default)


@dataclass
class PolicyLossConfig:
    clip_eps_low: float = 0.2  # ratio floor is 1 - clip_eps_low
    clip_eps_high: float = 0.28  # ratio ceiling is 1 + clip_eps_high: DAPO's "clip-higher" (symmetric PPO: 0.2)
    # token_mean: mean over every response token of the batch; seq_mean: per sample, then over samples
    loss_agg: LossAgg = LossAgg.token_mean


@dataclass
class GateConfig:
    enabled: bool = True  # False = the non-TOP baseline: metrics only, no verdict, no dump
    # a step whose log-probs differ: halt (no update applied, the batch dumped to parity/, the run stops) | warn (log it, go on)
    on_violation: OnViolation = OnViolation.halt


@dataclass
class DynamicSamplingConfig:
    """DAPO's dynamic sampling (top_rl/rl/dynamic_sampling.py): groups whose samples all score the same carry no
    gradient; they are dropped and more prompts are sampled until the step has rollout.prompts_per_step groups."""

    enabled: bool = False  # drop groups with one task reward and refill the batch from more rollout rounds
    # extra rounds of rollout.prompts_per_step prompts a step may add; a batch still short after them is topped up with
    # dropped groups (advantage 0: no gradient) so every step trains one batch shape (rollout/dynamic_filled_groups)
    max_rounds: int = 4


@dataclass
class OverlongConfig:
    """DAPO's overlong reward shaping (top_rl/rl/overlong.py): a response in the last `buffer` tokens before
    rollout.max_new_tokens loses reward linearly, down to -penalty_factor at the limit."""

    enabled: bool = False  # add the soft length penalty to each sample's task reward
    buffer: int = 4  # L_cache: the penalty's ramp, in tokens, ending at rollout.max_new_tokens (L_max)
    penalty_factor: float = 1.0  # the penalty at (and beyond) L_max; DAPO uses 1


@dataclass
class AlgoConfig:
    # The advantage estimator is GRPO's (rewards relative to the prompt's group: top_rl/rl/advantages.py)
    normalize_std: bool = True  # GRPO divides by the group's std; Dr.GRPO-style runs turn it off
    updates_per_rollout: int = 1  # optimizer steps per rollout batch (consecutive mini-batches; the gate
    #                               still sees every sample under the weights it was sampled with)
    loss: PolicyLossConfig = field(default_factory=PolicyLossConfig)
    # `recompute` costs one forward of the batch; under TOP it gives the rollout's bits again (the gate proves
    # they are the trainer's), so it matters for the non-TOP baseline (bench/rl_step_compare.py)
    old_logprobs: OldLogprobs = OldLogprobs.rollout
    dynamic_sampling: DynamicSamplingConfig = field(default_factory=DynamicSamplingConfig)
    overlong: OverlongConfig = field(default_factory=OverlongConfig)
