"""What a user reads off a step's rewards and advantages (metrics.jsonl, wandb): how spread the rewards are, how many
prompt groups carried no signal (every sample scored the same, so GRPO gives them advantage 0 and no gradient), and
the advantages the loss saw. Plain summaries of tensors the driver already holds: they change no number of the run."""

from __future__ import annotations

import torch


def reward_stats(rewards: torch.Tensor, n_samples: int) -> dict[str, float]:
    r = rewards.double().flatten()
    groups = r.view(-1, n_samples)
    one_value = (groups == groups[:, :1]).all(dim=1)  # exact equality: a reward is a label, not a measurement
    return {"rollout/reward_std": float(r.std(unbiased=False)), "rollout/reward_min": float(r.min()),
            "rollout/reward_max": float(r.max()),
            "rollout/groups_one_reward_frac": float(one_value.double().mean())}


def advantage_stats(advantages: torch.Tensor) -> dict[str, float]:
    a = advantages.double().flatten()
    return {"train/advantage_mean": float(a.mean()), "train/advantage_std": float(a.std(unbiased=False)),
            "train/advantage_min": float(a.min()), "train/advantage_max": float(a.max()),
            "train/advantage_zero_frac": float((a == 0).double().mean())}
