"""Train/rollout parity metrics (miles/slime names), computed over per-sample response log-probs.

Inputs are lists with one 1-D tensor per sample: the response tokens' log-probs as the trainer
recomputed them and as the rollout engine reported them. Unlike miles, a NaN/inf on either side is
never mapped to 0: it makes the metric non-finite and ``ParityMetrics.finite`` False.

abs_diff reduction: per-sample mean over response tokens, then mean over samples (miles'
``sum_of_sample_mean``), not a global token mean; the two differ off-TOP, both are 0 under TOP.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch

Tensors = Sequence[torch.Tensor]


def _pairs(trainer: Tensors, rollout: Tensors):
    if len(trainer) != len(rollout):
        raise ValueError(f"{len(trainer)} trainer samples vs {len(rollout)} rollout samples")
    for i, (t, r) in enumerate(zip(trainer, rollout)):
        t, r = t.detach().reshape(-1).double(), r.detach().reshape(-1).double()
        if t.numel() != r.numel():
            raise ValueError(f"sample {i}: trainer has {t.numel()} log-probs, rollout {r.numel()}")
        yield t, r


def _sample_mean(per_token: list[torch.Tensor]) -> float:
    # Mean over samples of each sample's token mean; samples without response tokens are skipped.
    means = [float(x.mean()) for x in per_token if x.numel() > 0]
    return sum(means) / len(means) if means else 0.0


def train_rollout_logprob_abs_diff(trainer: Tensors, rollout: Tensors) -> float:
    """mean_samples(mean_tokens |trainer - rollout|). NaN/inf inputs give NaN/inf, never 0."""
    return _sample_mean([(t - r).abs() for t, r in _pairs(trainer, rollout)])


def ess_ratio(logp_num: Tensors, logp_den: Tensors) -> float:
    """Normalised effective sample size, averaged over samples.

    Per sample, ``w = exp(logp_num - logp_den)`` per token and ``ESS = (sum w)^2 / (n * sum w^2)``
    in [1/n, 1]; exactly 1.0 iff all weights of the sample are equal (on-policy: all 1).
    For the gate, num = trainer and den = rollout. (miles computes it between the trainer's first
    update forward and its old log-probs; pass those to get that variant.) float64 throughout.
    """
    vals = []
    for num, den in _pairs(logp_num, logp_den):
        if num.numel() == 0:
            continue
        w = torch.exp(num - den)
        vals.append(float(w.sum() ** 2 / (w.numel() * (w * w).sum())))
    return sum(vals) / len(vals) if vals else 1.0


def train_rollout_kl(trainer: Tensors, rollout: Tensors) -> float:
    """Schulman **k3** estimate of KL(rollout || trainer), as miles' ``train/train_rollout_kl``.

    Per token, with d = trainer - rollout: ``k3 = exp(d) - 1 - d``, clamped to [-10, 10] as miles
    does; reduced like abs_diff (sample mean, then mean). A non-finite d gives NaN (the clamp would
    otherwise turn -inf into a harmless-looking 10).
    """
    per = []
    for t, r in _pairs(trainer, rollout):
        d = t - r
        k3 = (torch.exp(d) - 1.0 - d).clamp(-10.0, 10.0)
        per.append(torch.where(torch.isfinite(d), k3, torch.full_like(k3, math.nan)))
    return _sample_mean(per)


@dataclass
class FirstDiff:
    sample: int  # index in the batch
    position: int  # response-token position within the sample
    trainer: float
    rollout: float


def first_difference(trainer: Tensors, rollout: Tensors) -> FirstDiff | None:
    """First (sample, position) in sample-major order where the values are not equal, or where
    either side is non-finite (two NaNs are a difference, not a match). None if all equal."""
    for i, (t, r) in enumerate(_pairs(trainer, rollout)):
        bad = (t != r) | ~torch.isfinite(t) | ~torch.isfinite(r)
        if bad.any():
            p = int(bad.nonzero()[0])
            return FirstDiff(i, p, float(t[p]), float(r[p]))
    return None


@dataclass
class ParityMetrics:
    abs_diff: float
    abs_diff_max: float
    ess_ratio: float
    kl: float
    frac_equal: float  # fraction of response tokens whose two log-probs are equal
    n_tokens: int
    n_nonfinite: int  # tokens with NaN/inf on either side
    first_diff: FirstDiff | None
    ess_ratio_update: float | None = None  # miles' variant, when the first-update forward is given

    @property
    def finite(self) -> bool:
        return self.n_nonfinite == 0 and all(
            math.isfinite(v) for v in (self.abs_diff, self.ess_ratio, self.kl))

    @property
    def violation(self) -> bool:
        """TOP's demand: exactly 0 and exactly 1, everything finite, every token equal."""
        return (not self.finite or self.abs_diff != 0.0 or self.ess_ratio != 1.0
                or self.first_diff is not None
                or (self.ess_ratio_update is not None and self.ess_ratio_update != 1.0))

    def to_dict(self, prefix: str = "train/") -> dict[str, float]:
        d = {
            "train_rollout_logprob_abs_diff": self.abs_diff,
            "train_rollout_logprob_abs_diff_max": self.abs_diff_max,
            "ess_ratio": self.ess_ratio,
            "train_rollout_kl": self.kl,
            "train_rollout_logprob_frac_equal": self.frac_equal,
            "train_rollout_nonfinite_tokens": float(self.n_nonfinite),
        }
        if self.ess_ratio_update is not None:
            d["ess_ratio_update"] = self.ess_ratio_update
        return {prefix + k: v for k, v in d.items()}


def parity_metrics(trainer: Tensors, rollout: Tensors,
                   update_logprobs: Tensors | None = None) -> ParityMetrics:
    """All parity metrics for one batch. ``update_logprobs`` (optional): the trainer's log-probs
    from the first training forward, giving ``ess_ratio_update`` against ``trainer``."""
    pairs = list(_pairs(trainer, rollout))
    n_tok = sum(t.numel() for t, _ in pairs)
    diffs = [(t - r).abs() for t, r in pairs]
    nonfinite = sum(int((~torch.isfinite(t) | ~torch.isfinite(r)).sum()) for t, r in pairs)
    equal = sum(int(((t == r) & torch.isfinite(t)).sum()) for t, r in pairs)
    dmax = max((float(d.max()) for d in diffs if d.numel()), default=0.0)
    if any(torch.isnan(d).any() for d in diffs):
        dmax = math.nan  # max() over tensors with NaN is unreliable across versions; be explicit
    return ParityMetrics(
        abs_diff=_sample_mean(diffs),
        abs_diff_max=dmax,
        ess_ratio=ess_ratio(trainer, rollout),
        kl=train_rollout_kl(trainer, rollout),
        frac_equal=equal / n_tok if n_tok else 1.0,
        n_tokens=n_tok,
        n_nonfinite=nonfinite,
        first_diff=first_difference(trainer, rollout),
        ess_ratio_update=None if update_logprobs is None else ess_ratio(update_logprobs, trainer),
    )
