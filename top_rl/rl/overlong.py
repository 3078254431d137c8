"""DAPO's overlong reward shaping (Yu et al. 2025, "DAPO", eq. 13): a soft length penalty added to the task reward,
so a response cut by the length limit is not scored as if it were a wrong answer of any length. With L_max =
rollout.max_new_tokens and L_cache = algo.overlong.buffer:

    R_length(y) = 0                                  |y| <= L_max - L_cache
                = ((L_max - L_cache) - |y|) / L_cache   L_max - L_cache < |y| <= L_max
                = -1                                 L_max < |y|

scaled by algo.overlong.penalty_factor (verl's overlong_penalty_factor; DAPO's is 1). |y| counts the response's
tokens as generated, its eos included: the length the limit cuts. The engines never return more than L_max tokens,
so the last branch is the definition's, kept for a caller that scores other responses. Pure and deterministic: a
function of lengths only, applied on the driver after the rewards, before the advantages."""

from __future__ import annotations


def penalty(length: int, max_len: int, buffer: int, factor: float = 1.0) -> float:
    """factor * R_length for a response of `length` tokens (the formula above)."""
    start = max_len - buffer
    if length <= start:
        return 0.0
    if length <= max_len:
        return factor * (start - length) / buffer
    return -factor


def shape(rewards: list[float], lengths: list[int], max_len: int, buffer: int, factor: float) -> list[float]:
    """Each reward plus its response's length penalty."""
    return [r + penalty(n, max_len, buffer, factor) for r, n in zip(rewards, lengths)]


def shape_with_metrics(scores: list[float], lengths: list[int], max_len: int, buffer: int,
                       factor: float) -> tuple[list[float], dict]:
    """The shaped rewards and the step's metrics of the shaping (the task's own reward mean, the mean penalty, the
    share of samples penalized)."""
    shaped = shape(scores, lengths, max_len, buffer, factor)
    n = len(scores)
    return shaped, {"rollout/task_reward_mean": sum(scores) / n,
                    "rollout/overlong_penalty_mean": (sum(shaped) - sum(scores)) / n,
                    "rollout/overlong_penalized_frac": sum(a != b for a, b in zip(shaped, scores)) / n}


def errors(buffer: int, factor: float, max_new_tokens: int) -> list[str]:
    """algo.overlong.* refusals (top_rl.config_checks.validate), one line each, naming the key and the fix."""
    out = []
    if not 1 <= buffer <= max_new_tokens:
        out.append(f"algo.overlong.buffer={buffer} must be in [1, rollout.max_new_tokens={max_new_tokens}]: the "
                   "penalty ramps over the last `buffer` tokens before the length limit")
    if not factor >= 0:
        out.append(f"algo.overlong.penalty_factor={factor} must be >= 0 (a negative factor rewards overlong answers)")
    return out
