"""The policy-update algorithm of a run: GRPO advantages with a PPO-clip loss."""

from __future__ import annotations

from dataclasses import dataclass, field

from top_rl.rl.losses import PolicyLossConfig


@dataclass
class AlgoConfig:
    name: str = "grpo"
    normalize_std: bool = True  # GRPO divides by the group's std; Dr.GRPO-style runs turn it off
    updates_per_rollout: int = 1  # optimizer steps per rollout batch (consecutive mini-batches; the gate
    #                               still sees every sample under the weights it was sampled with)
    loss: PolicyLossConfig = field(default_factory=PolicyLossConfig)
