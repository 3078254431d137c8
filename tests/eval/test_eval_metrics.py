"""The eval's summary (top_rl/eval/metrics.py): pass@k against brute force, the reported k, accuracy and lengths."""

import itertools

import pytest

from top_rl.eval import metrics


@pytest.mark.parametrize("n,c,k", [(4, 0, 1), (4, 1, 1), (4, 1, 2), (4, 2, 2), (5, 3, 4), (4, 4, 4), (6, 1, 6)])
def test_pass_at_k_is_the_chance_k_draws_hold_a_correct_one(n, c, k):
    correct = [True] * c + [False] * (n - c)
    draws = list(itertools.combinations(range(n), k))
    brute = sum(any(correct[i] for i in d) for d in draws) / len(draws)
    assert metrics.pass_at_k(n, c, k) == pytest.approx(brute)


def test_ks_and_summary():
    assert metrics.ks(1) == [1] and metrics.ks(4) == [1, 2, 4] and metrics.ks(6) == [1, 2, 4, 6]
    rows = metrics.summarise([1, 0, 0, 0, 0.5, 1], [3, 4, 2, 1, 4, 4], [False, True, False, False, True, True], n=2,
                             skipped=1, seconds=0.5)
    assert rows["eval/accuracy"] == pytest.approx(2.5 / 6) and rows["eval/prompts"] == 3
    assert rows["eval/pass@1"] == pytest.approx((0.5 + 0 + 1) / 3) and rows["eval/pass@2"] == pytest.approx(2 / 3)
    assert rows["eval/response_len_mean"] == 3 and rows["eval/truncated_frac"] == 0.5
    assert rows["eval/prompts_skipped"] == 1 and rows["perf/eval_time"] == 0.5
    one = metrics.summarise([1, 0], [1, 1], [False, False], n=1, skipped=0, seconds=0.0)
    assert not any(k.startswith("eval/pass@") for k in one)  # one sample a prompt: accuracy is pass@1
