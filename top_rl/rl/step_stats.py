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


def entropy_estimate(sample_logprobs: list[list[float]]) -> dict[str, float]:
    """rollout/entropy_mc: the sampled tokens' mean negative log-prob under the distribution they were drawn from (the
    sampler's tempered log-probs every engine reports). Its expectation is the policy's per-token entropy (a Monte
    Carlo estimate over the step's tokens: E_{y~p}[-log p(y)] = H(p)), and under TOP that distribution is exactly the
    trainer's, so no logit tensor is needed: the trainer's fused log-prob kernels never materialise a [T, V] softmax,
    and verl's exact actor/entropy would cost one (a TP all-reduce over the vocabulary). Empty when no engine
    reported them."""
    n = sum(len(lp) for lp in sample_logprobs)
    if n == 0:
        return {}
    return {"rollout/entropy_mc": -sum(float(x) for lp in sample_logprobs for x in lp) / n}
