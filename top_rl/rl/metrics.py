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


class _Packed:
    """Both sides packed once (float64): flat tensors, per-token sample index, per-sample lengths."""

    def __init__(self, trainer: Tensors, rollout: Tensors):
        if len(trainer) != len(rollout):
            raise ValueError(f"{len(trainer)} trainer samples vs {len(rollout)} rollout samples")
        ts = [t.detach().reshape(-1) for t in trainer]
        rs = [r.detach().reshape(-1) for r in rollout]
        for i, (t, r) in enumerate(zip(ts, rs)):
            if t.numel() != r.numel():
                raise ValueError(f"sample {i}: trainer has {t.numel()} log-probs, rollout {r.numel()}")
        self.lengths = torch.tensor([t.numel() for t in ts], dtype=torch.long)
        empty = torch.zeros(0, dtype=torch.float64)
        self.t = torch.cat([t.double().cpu() for t in ts]) if ts else empty
        self.r = torch.cat([r.double().cpu() for r in rs]) if rs else empty
        self.seg = torch.repeat_interleave(torch.arange(len(ts)), self.lengths)

    def sample_sums(self, x: torch.Tensor) -> torch.Tensor:
        return torch.zeros(len(self.lengths), dtype=x.dtype).index_add_(0, self.seg, x)

    def sample_mean(self, per_token: torch.Tensor) -> float:
        """Mean over samples of each sample's token mean; samples without response tokens are skipped."""
        has = self.lengths > 0
        if not bool(has.any()):
            return 0.0
        return float((self.sample_sums(per_token)[has] / self.lengths[has]).mean())

    def ess(self, num: torch.Tensor, den: torch.Tensor) -> float:
        has = self.lengths > 0
        if not bool(has.any()):
            return 1.0
        w = torch.exp(num - den)
        sw, sw2 = self.sample_sums(w)[has], self.sample_sums(w * w)[has]
        return float((sw * sw / (self.lengths[has] * sw2)).mean())


def train_rollout_logprob_abs_diff(trainer: Tensors, rollout: Tensors) -> float:
    """mean_samples(mean_tokens |trainer - rollout|). NaN/inf inputs give NaN/inf, never 0."""
    p = _Packed(trainer, rollout)
    return p.sample_mean((p.t - p.r).abs())


def ess_ratio(logp_num: Tensors, logp_den: Tensors) -> float:
    """Normalised effective sample size, averaged over samples.

    Per sample, ``w = exp(logp_num - logp_den)`` per token and ``ESS = (sum w)^2 / (n * sum w^2)``
    in [1/n, 1]; exactly 1.0 iff all weights of the sample are equal (on-policy: all 1).
    For the gate, num = trainer and den = rollout. (miles computes it between the trainer's first
    update forward and its old log-probs; pass those to get that variant.) float64 throughout.
    """
    p = _Packed(logp_num, logp_den)
    return p.ess(p.t, p.r)


def _k3(d: torch.Tensor) -> torch.Tensor:
    k3 = (torch.exp(d) - 1.0 - d).clamp(-10.0, 10.0)
    return torch.where(torch.isfinite(d), k3, torch.full_like(k3, math.nan))


def train_rollout_kl(trainer: Tensors, rollout: Tensors) -> float:
    """Schulman **k3** estimate of KL(rollout || trainer), as miles' ``train/train_rollout_kl``.

    Per token, with d = trainer - rollout: ``k3 = exp(d) - 1 - d``, clamped to [-10, 10] as miles
    does; reduced like abs_diff (sample mean, then mean). A non-finite d gives NaN (the clamp would
    otherwise turn -inf into a harmless-looking 10).
    """
    p = _Packed(trainer, rollout)
    return p.sample_mean(_k3(p.t - p.r))


def _first_difference(p: _Packed) -> "FirstDiff | None":
    bad = (p.t != p.r) | ~torch.isfinite(p.t) | ~torch.isfinite(p.r)
    if not bool(bad.any()):
        return None
    k = int(bad.nonzero()[0])
    i = int(p.seg[k])
    start = int(p.lengths[:i].sum())
    return FirstDiff(i, k - start, float(p.t[k]), float(p.r[k]))


def first_difference(trainer: Tensors, rollout: Tensors) -> "FirstDiff | None":
    """First (sample, position) in sample-major order where the values are not equal, or where
    either side is non-finite (two NaNs are a difference, not a match). None if all equal."""
    return _first_difference(_Packed(trainer, rollout))


@dataclass
class FirstDiff:
    sample: int  # index in the batch
    position: int  # response-token position within the sample
    trainer: float
    rollout: float


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

    @property
    def finite(self) -> bool:
        return self.n_nonfinite == 0 and all(
            math.isfinite(v) for v in (self.abs_diff, self.ess_ratio, self.kl))

    @property
    def violation(self) -> bool:
        """TOP's demand: exactly 0 and exactly 1, everything finite, every token equal."""
        return (not self.finite or self.abs_diff != 0.0 or self.ess_ratio != 1.0
                or self.first_diff is not None)

    def to_dict(self, prefix: str = "train/") -> dict[str, float]:
        d = {
            "train_rollout_logprob_abs_diff": self.abs_diff,
            "train_rollout_logprob_abs_diff_max": self.abs_diff_max,
            "ess_ratio": self.ess_ratio,
            "train_rollout_kl": self.kl,
            "train_rollout_logprob_frac_equal": self.frac_equal,
            "train_rollout_nonfinite_tokens": float(self.n_nonfinite),
        }
        return {prefix + k: v for k, v in d.items()}


def parity_metrics(trainer: Tensors, rollout: Tensors) -> ParityMetrics:
    """All parity metrics for one batch, from one packed pass. (The trainer's numbers come from its training
    forward itself, top_rl/train/rl_step.py, so no separate first-update variant exists to compare.)"""
    p = _Packed(trainer, rollout)
    d = p.t - p.r
    finite = torch.isfinite(p.t) & torch.isfinite(p.r)
    adiff = d.abs()
    dmax = float(adiff.max()) if adiff.numel() else 0.0
    if bool(torch.isnan(adiff).any()):
        dmax = math.nan  # max() over tensors with NaN is unreliable across versions; be explicit
    n_tok = int(p.t.numel())
    return ParityMetrics(
        abs_diff=p.sample_mean(adiff),
        abs_diff_max=dmax,
        ess_ratio=p.ess(p.t, p.r),
        kl=p.sample_mean(_k3(d)),
        frac_equal=int(((p.t == p.r) & torch.isfinite(p.t)).sum()) / n_tok if n_tok else 1.0,
        n_tokens=n_tok,
        n_nonfinite=int((~finite).sum()),
        first_diff=_first_difference(p),
    )
