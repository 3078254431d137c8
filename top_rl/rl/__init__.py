"""RL building blocks: advantages, the PPO-clip loss, parity metrics and the TOP gate.

Layout convention shared by every function here: a batch of responses is *ragged*, so per-token
quantities are passed as a list of 1-D tensors, one per sample (response tokens only, already
shifted so entry t is log p(response[t] | prefix)). Functions that run on the hot path also accept
the packed form (one flat 1-D tensor + ``lengths``) through :func:`top_rl.rl.losses.pack`.
"""

from top_rl.rl.advantages import GrpoConfig, grpo_advantages
from top_rl.rl.gate import GateConfig, ParityViolation, check
from top_rl.rl.losses import PolicyLossConfig, pack, policy_loss
from top_rl.rl.metrics import (
    ParityMetrics,
    ess_ratio,
    first_difference,
    parity_metrics,
    train_rollout_kl,
    train_rollout_logprob_abs_diff,
)

__all__ = [
    "GrpoConfig", "grpo_advantages",
    "PolicyLossConfig", "pack", "policy_loss",
    "ParityMetrics", "parity_metrics", "train_rollout_logprob_abs_diff", "ess_ratio",
    "train_rollout_kl", "first_difference",
    "GateConfig", "ParityViolation", "check",
]
