import math

import pytest
import torch

from top_rl.rl.advantages import grpo_advantages
from top_rl.config.algo import PolicyLossConfig
from top_rl.rl.losses import concat_ragged, policy_loss


def test_grpo_advantages_hand_computed():
    r = torch.tensor([1.0, 0, 0, 0, 1, 1, 0, 0, 1, 1, 1, 1])
    a = grpo_advantages(r, n_samples=4, normalize_std=True, eps=0.0)
    # group 1: mean .25, unbiased std sqrt(.75/3) = .5 ; group 2: mean .5, std sqrt(1/3)
    s = 0.5 / math.sqrt(1 / 3)
    exp = torch.tensor([1.5, -0.5, -0.5, -0.5, s, s, -s, -s, 0, 0, 0, 0])
    torch.testing.assert_close(a, exp)
    b = grpo_advantages(r, n_samples=4, normalize_std=False)
    torch.testing.assert_close(b, torch.tensor([.75, -.25, -.25, -.25, .5, .5, -.5, -.5, 0, 0, 0, 0]))
    # all-equal group stays exactly 0 thanks to eps, not NaN
    assert torch.equal(grpo_advantages(torch.ones(4), 4), torch.zeros(4))


def test_grpo_advantages_errors():
    with pytest.raises(ValueError, match="groups of 3"):
        grpo_advantages(torch.zeros(4), 3)
    with pytest.raises(ValueError, match="sample 2"):
        grpo_advantages(torch.tensor([0.0, 1.0, float("nan"), 0.0]), 2)


def _batch():
    new = torch.log(torch.tensor([1.5, 0.5, 1.1], dtype=torch.float64)).requires_grad_()
    old = torch.zeros(3, dtype=torch.float64)
    adv = torch.tensor([1.0, -1.0], dtype=torch.float64)
    return new, old, adv, [2, 1]


def test_ppo_clip_token_mean_by_hand():
    new, old, adv, lengths = _batch()
    loss, m = policy_loss(new, old, adv, lengths, PolicyLossConfig(0.2, 0.2, "token_mean"))
    # token0: A=1, r=1.5 -> clipped to 1.2 -> -1.2 ; token1: A=1, r=.5 -> -.5 ; token2: A=-1, r=1.1 -> 1.1
    assert loss.item() == pytest.approx((-1.2 - 0.5 + 1.1) / 3)
    assert m["pg_clipfrac"] == pytest.approx(1 / 3)
    assert m["ppo_kl"] == pytest.approx(-(math.log(1.5) + math.log(0.5) + math.log(1.1)) / 3)
    assert m["ratio_max"] == pytest.approx(1.5) and m["ratio_min"] == pytest.approx(0.5)
    loss.backward()
    # clipped token has no gradient; d(-A r)/d logp = -A r, divided by 3 tokens
    torch.testing.assert_close(new.grad, torch.tensor([0.0, -0.5 / 3, 1.1 / 3], dtype=torch.float64))


def test_ppo_clip_higher_and_seq_mean():
    new, old, adv, lengths = _batch()
    loss, m = policy_loss(new, old, adv, lengths, PolicyLossConfig(0.2, 0.6, "token_mean"))
    assert loss.item() == pytest.approx((-1.5 - 0.5 + 1.1) / 3) and m["pg_clipfrac"] == 0.0
    loss, _ = policy_loss(new, old, adv, lengths, PolicyLossConfig(0.2, 0.2, "seq_mean"))
    assert loss.item() == pytest.approx(((-1.2 - 0.5) / 2 + 1.1) / 2)
    # negative advantage with ratio below 1 - eps_low is clipped from below
    l2, m2 = policy_loss(torch.log(torch.tensor([0.5])), torch.zeros(1), torch.tensor([-1.0]), [1])
    assert l2.item() == pytest.approx(0.8) and m2["pg_clipfrac"] == 1.0


def test_k3_kl_and_entropy_metric():
    new, old, adv, lengths = _batch()
    ref = torch.zeros(3, dtype=torch.float64)
    ent = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)
    base, _ = policy_loss(new, old, adv, lengths)
    loss, m = policy_loss(new, old, adv, lengths, PolicyLossConfig(), ref, entropy=ent, kl_coef=0.5)
    k3 = [1 / x + math.log(x) - 1 for x in (1.5, 0.5, 1.1)]  # exp(ref-new) - (ref-new) - 1
    assert m["kl_ref"] == pytest.approx(sum(k3) / 3)
    assert loss.item() == pytest.approx(base.item() + 0.5 * sum(k3) / 3)
    assert m["entropy"] == pytest.approx(2.0)
    with pytest.raises(ValueError, match="ref_logprobs"):
        policy_loss(new, old, adv, lengths, kl_coef=0.1)


def test_nan_in_masked_position_does_not_poison():
    new, old, adv, lengths = _batch()
    loss, _ = policy_loss(new, old, adv, lengths)
    loss.backward()
    g = new.grad.clone()
    new2 = torch.cat([new.detach(), torch.tensor([float("nan")], dtype=torch.float64)]).requires_grad_()
    old2 = torch.cat([old, torch.tensor([float("inf")], dtype=torch.float64)])
    mask = torch.tensor([True, True, True, False])
    loss2, m = policy_loss(new2, old2, adv, [2, 2], loss_mask=mask,
                           ref_logprobs=torch.full((4,), float("nan"), dtype=torch.float64).masked_fill(mask, 0))
    loss2.backward()
    assert loss2.item() == pytest.approx(loss.item())
    assert torch.isfinite(new2.grad).all()
    torch.testing.assert_close(new2.grad[:3], g)
    assert math.isfinite(m["ppo_kl"]) and math.isfinite(m["ratio_max"])


def test_microbatch_denominator_sums_to_full_batch():
    new, old, adv, lengths = _batch()
    for agg, denom in (("token_mean", 3), ("seq_mean", 2)):
        cfg = PolicyLossConfig(loss_agg=agg)
        full, _ = policy_loss(new, old, adv, lengths, cfg)
        a, _ = policy_loss(new[:2], old[:2], adv[:1], [2], cfg, denominator=denom)
        b, _ = policy_loss(new[2:], old[2:], adv[1:], [1], cfg, denominator=denom)
        assert (a + b).item() == pytest.approx(full.item())


def test_pack_and_shape_checks():
    flat, lengths = concat_ragged([torch.tensor([1.0, 2.0]), torch.tensor([]), torch.tensor([3.0])])
    assert torch.equal(flat, torch.tensor([1.0, 2.0, 3.0])) and lengths.tolist() == [2, 0, 1]
    # an empty sample contributes nothing and does not dilute seq_mean
    loss, _ = policy_loss(flat.log(), torch.zeros(3), torch.tensor([1.0, 5.0, 0.0]), lengths,
                          PolicyLossConfig(0.9, 9.0, "seq_mean"))
    # ratios 1, 2 with A=1 -> sample mean -1.5 ; sample 2 has A=0 -> 0 ; mean over 2 samples
    assert loss.item() == pytest.approx(-0.75)
    with pytest.raises(ValueError, match="packed"):
        policy_loss(torch.zeros(4), torch.zeros(4), torch.zeros(2), [2, 1])
    with pytest.raises(ValueError, match="loss_agg"):
        policy_loss(torch.zeros(3), torch.zeros(3), torch.zeros(2), [2, 1], PolicyLossConfig(loss_agg="sum"))
