"""eval/* metrics from an eval's rewards and responses. A sample is correct when its reward is > 0 (a task's reward is
1 for a right answer, 0 otherwise; a custom reward's partial credit counts as correct for pass@k, while eval/accuracy
is its plain mean)."""

from __future__ import annotations

from math import comb


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k estimator (Chen et al. 2021, Codex): the chance that k of n samples, c of them correct,
    drawn without replacement, hold a correct one: 1 - C(n - c, k) / C(n, k)."""
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


def ks(n: int) -> list[int]:
    """The k reported for n samples a prompt: 1, 2, 4, ... up to n, and n itself."""
    out, k = [], 1
    while k < n:
        out.append(k)
        k *= 2
    return out + [n]


def summarise(rewards: list[float], lengths: list[int], truncated: list[bool], n: int, skipped: int,
              seconds: float) -> dict:
    """The eval's row entries: rewards in prompt order, n per prompt."""
    groups = [rewards[i:i + n] for i in range(0, len(rewards), n)]
    out = {"eval/accuracy": sum(rewards) / len(rewards),
           "eval/response_len_mean": sum(lengths) / len(lengths),
           "eval/truncated_frac": sum(truncated) / len(truncated),
           "eval/prompts": len(groups), "eval/prompts_skipped": skipped, "perf/eval_time": seconds}
    if n > 1:
        for k in ks(n):
            out[f"eval/pass@{k}"] = sum(pass_at_k(n, sum(r > 0 for r in g), k) for g in groups) / len(groups)
    return out
