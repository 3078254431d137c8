"""Reward and advantage summaries per step (top_rl/rl/step_stats.py): the numbers users look for, from the tensors the
driver holds."""

import torch

from top_rl.rl import grpo_advantages
from top_rl.rl.step_stats import advantage_stats, reward_stats


def test_reward_spread_and_groups_with_one_reward_value():
    rewards = torch.tensor([1.0, 1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0])  # 3 groups of 4
    s = reward_stats(rewards, 4)
    assert s["rollout/groups_one_reward_frac"] == 2 / 3  # the all-1 and the all-0 groups
    assert (s["rollout/reward_min"], s["rollout/reward_max"]) == (0.0, 1.0)
    assert abs(s["rollout/reward_std"] - float(rewards.double().std(unbiased=False))) == 0


def test_advantage_stats_see_the_zero_advantage_of_uniform_groups():
    rewards = torch.tensor([1.0, 1.0, 0.0, 1.0])
    a = advantage_stats(grpo_advantages(rewards, 2))
    assert a["train/advantage_zero_frac"] == 0.5 and a["train/advantage_max"] > 0 > a["train/advantage_min"]
    assert abs(a["train/advantage_mean"]) < 1e-7


def test_entropy_estimate_is_the_mean_negative_sampled_logprob_and_converges_to_the_entropy():
    from top_rl.rl.step_stats import entropy_estimate

    assert entropy_estimate([[-1.0, -2.0], [-3.0]]) == {"rollout/entropy_mc": 2.0}
    assert entropy_estimate([[], []]) == {}
    # tokens drawn from p: the estimate approaches H(p)
    p = torch.tensor([0.5, 0.25, 0.125, 0.125], dtype=torch.float64)
    g = torch.Generator().manual_seed(0)
    draws = torch.multinomial(p, 200_000, replacement=True, generator=g)
    est = entropy_estimate([p.log()[draws].tolist()])["rollout/entropy_mc"]
    assert abs(est - float(-(p * p.log()).sum())) < 0.01
