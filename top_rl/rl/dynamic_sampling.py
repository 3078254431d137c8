"""DAPO's dynamic sampling (Yu et al. 2025, "DAPO", §3.2): a prompt group whose samples all get the same task reward
(all right or all wrong) has GRPO advantage 0 everywhere and gives no gradient, so it is dropped, and more prompts are
sampled until the step holds rollout.prompts_per_step groups with a signal.

How it runs here (the fill: top_rl/driver/step_batch.py), and why:
- A step's first round is the step's ordinary rollout, its seeds the ordinary ones: a run with dynamic sampling on
  samples round 0 exactly as a run without it.
- Each extra round draws the next rollout.prompts_per_step prompts from the data stream (verl's gen batch, over-sampled
  as in the paper) and samples them with seeds (run seed, step, round, sample): `round_index`. Every prompt a round draws
  is consumed: the data position moves past all of them, so a resume from the step's checkpoint draws what the run
  that never stopped drew next, and regenerates nothing differently (a sample is a function of prompt, seed, weights).
- Groups are judged on the task's reward (DAPO's accuracy, verl's filter_groups.metric=acc), before overlong shaping:
  a length penalty makes a group's shaped rewards differ without any answer differing.
- Kept groups enter the batch in the order drawn; signal groups beyond the batch are discarded (counted).
- At algo.dynamic_sampling.max_rounds extra rounds a batch still short is topped up with dropped groups, the earliest
  drawn first: they carry advantage 0 (no gradient; under token_mean they only dilute), and every step trains one batch
  shape (micro-batch plans, updates_per_rollout), never an empty one. verl stops the run there instead; a step that
  reaches the cap is visible in rollout/dynamic_filled_groups."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

# top_rl.engine.interface.sample_seed's per-step multiplier (a layer above this one): a step's seed indices stay below it,
# or step k's last seeds would be step k + 1's first (tests/rl/test_dynamic_sampling.py checks the two agree)
SEED_INDEX_SPAN = 65_537


def round_index(round_: int, index: int, batch: int) -> int:
    """The step-seed index of sample `index` of round `round_` (the loop seeds it sample_seed(seed, step, this)): round
    0's are the step's ordinary indices; the rounds' never overlap, and stay below SEED_INDEX_SPAN while
    (max_rounds + 1) * batch <= SEED_INDEX_SPAN (refused otherwise: `errors`), so no seed repeats across steps."""
    return round_ * batch + index


@dataclass
class Round:
    """One round's samples, in group order (sample i belongs to group i // n): each sample's prompt item, the engine's
    sample and its task reward."""

    items: list
    samples: list
    scores: list[float]


@dataclass
class Filled:
    """The step's batch (prompts_per_step groups, the same layout as a Round) and what filling it did."""

    items: list = field(default_factory=list)
    samples: list = field(default_factory=list)
    scores: list[float] = field(default_factory=list)
    metrics: dict = field(default_factory=dict)


def has_signal(scores: list[float]) -> bool:
    """Whether a group's rewards differ (exact equality: a reward is a label, not a measurement)."""
    return any(s != scores[0] for s in scores)


def fill(first: Round, draw: Callable[[int], Round], groups: int, n: int, max_rounds: int) -> Filled:
    """The batch of `groups` groups of `n` samples: `first`'s groups with a signal, then those of `draw(1)`,
    `draw(2)`, ... (each a further round) until there are enough or `max_rounds` extra rounds ran (see module doc)."""
    kept, dropped, drawn, rounds, scores_all = [], [], 0, 0, []
    current = first
    while True:
        for g in range(len(current.scores) // n):
            part = slice(g * n, (g + 1) * n)
            group = (current.items[part], current.samples[part], current.scores[part])
            (kept if has_signal(group[2]) else dropped).append(group)
        drawn += len(current.scores) // n
        scores_all += current.scores
        if len(kept) >= groups or rounds == max_rounds:
            break
        rounds += 1
        current = draw(rounds)
    batch = kept[:groups]
    filled = dropped[:groups - len(batch)]
    out = Filled(metrics={
        "rollout/dynamic_rounds": rounds,  # extra rounds this step ran
        "rollout/dynamic_drawn_groups": drawn,
        "rollout/dynamic_dropped_groups": len(dropped),  # groups with one reward, over every round
        "rollout/dynamic_filled_groups": len(filled),  # dropped groups put back at the cap
        "rollout/dynamic_surplus_groups": len(kept) - len(batch),  # signal groups beyond the batch, unused
        # every sample drawn this step, before any filter: the policy's reward as a run without filtering sees it
        "rollout/dynamic_reward_mean_drawn": sum(scores_all) / len(scores_all),
    })
    for items, samples, scores in batch + filled:
        out.items += items
        out.samples += samples
        out.scores += scores
    return out


def errors(max_rounds: int, batch: int) -> list[str]:
    """algo.dynamic_sampling.* refusals (top_rl.config_checks.validate), one line each, naming the key and the fix."""
    if max_rounds < 0:
        return [f"algo.dynamic_sampling.max_rounds={max_rounds} must be >= 0 (extra rollout rounds a step may add)"]
    if (max_rounds + 1) * batch > SEED_INDEX_SPAN:
        return [f"algo.dynamic_sampling.max_rounds={max_rounds}: {max_rounds + 1} rounds of {batch} samples "
                f"(rollout.prompts_per_step x rollout.n_samples) need {(max_rounds + 1) * batch} sampling seeds per "
                f"step, more than the {SEED_INDEX_SPAN} a step has; use max_rounds <= {SEED_INDEX_SPAN // batch - 1}"]
    return []
