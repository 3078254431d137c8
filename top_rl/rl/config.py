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


class AlgoName(StrEnum):
    grpo = "grpo"


class OldLogprobs(StrEnum):
    """PPO's old policy: where the ratio's denominator comes from."""

    rollout = "rollout"  # the sampler's log-probs the engine reported (under TOP: proven equal to the trainer's)
    recompute = "recompute"  # one forward-only pass of the trainer before the update (verl's and slime's default)


@dataclass
class PolicyLossConfig:
    clip_eps_low: float = 0.2  # ratio floor is 1 - clip_eps_low
    clip_eps_high: float = 0.2  # ratio ceiling is 1 + clip_eps_high; DAPO "clip-higher" uses 0.28
    # token_mean: mean over every response token of the batch; seq_mean: per sample, then over samples
    loss_agg: LossAgg = LossAgg.token_mean
    kl_coef: float = 0.0  # weight of the k3 KL(pi || ref) penalty; the run loop refuses > 0 (no reference policy)


@dataclass
class GateConfig:
    enabled: bool = True  # False = the non-TOP baseline: metrics only, no verdict, no dump
    # a step whose log-probs differ: halt (no update applied, the batch dumped to parity/, the run stops) | warn (log it, go on)
    on_violation: OnViolation = OnViolation.halt


@dataclass
class AlgoConfig:
    name: AlgoName = AlgoName.grpo  # the advantage estimator (GRPO: rewards relative to the prompt's group)
    normalize_std: bool = True  # GRPO divides by the group's std; Dr.GRPO-style runs turn it off
    updates_per_rollout: int = 1  # optimizer steps per rollout batch (consecutive mini-batches; the gate
    #                               still sees every sample under the weights it was sampled with)
    loss: PolicyLossConfig = field(default_factory=PolicyLossConfig)
    # `recompute` costs one forward of the batch; under TOP it gives the rollout's bits again (the gate proves
    # they are the trainer's), so it matters for the non-TOP baseline (bench/rl_step_compare.py)
    old_logprobs: OldLogprobs = OldLogprobs.rollout
