"""PPO-clip policy loss (GRPO/DAPO style) over ragged responses.

Representation: per-token tensors are *packed* — one flat 1-D tensor holding every sample's
response tokens back to back, plus ``lengths`` (tokens per sample, summing to the flat length).
This is the layout the packed-prefill trainer produces, so no padding is ever materialised.
:func:`concat_ragged` turns a list of per-sample 1-D tensors into that form.
"""

from __future__ import annotations

from typing import Sequence

import torch

from top_rl.config.algo import LossAgg, PolicyLossConfig

def concat_ragged(per_sample: Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """List of 1-D tensors -> (flat tensor, lengths int64 tensor)."""
    lengths = torch.tensor([int(t.numel()) for t in per_sample], dtype=torch.long)
    flat = torch.cat([t.reshape(-1) for t in per_sample]) if len(per_sample) else torch.zeros(0)
    return flat, lengths


def _per_sample_sum(x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    # split + pad + sum rather than index_add_: CUDA's index_add_ on floats uses atomics, and the
    # loss should be reproducible run to run (resume must replay the same update).
    parts = torch.split(x, lengths.tolist())
    if not parts:
        return x.new_zeros(0)
    return torch.nn.utils.rnn.pad_sequence(list(parts), batch_first=True).sum(dim=1)


def policy_loss(
    new_logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    lengths: torch.Tensor | Sequence[int],
    cfg: PolicyLossConfig = PolicyLossConfig(),
    ref_logprobs: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
    loss_mask: torch.Tensor | None = None,
    denominator: float | None = None,
    kl_coef: float = 0.0,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped surrogate loss.

    ``new_logprobs`` (requires grad), ``old_logprobs``, ``ref_logprobs``, ``entropy`` and
    ``loss_mask`` are packed ``[T]``; ``advantages`` is per sample ``[n]``; ``lengths`` is ``[n]``.
    Per token: ``ratio = exp(new - old)``,
    ``l = max(-A * ratio, -A * clamp(ratio, 1 - eps_low, 1 + eps_high)) + kl_coef * k3``, with
    ``k3 = exp(ref - new) - (ref - new) - 1`` (Schulman's unbiased, non-negative KL(pi||ref)). ``kl_coef`` is the
    library's (the run loop keeps no reference policy: its config has no such key, so its loss is the surrogate alone).

    Masked tokens are *selected away* before any arithmetic (never multiplied by 0), so a NaN or
    inf sitting in a masked position changes neither the loss nor the gradient.

    ``denominator`` overrides the local normaliser (token count for token_mean, sample count for
    seq_mean) so a step split into micro-batches can divide by the whole step's count and the
    micro-batch losses add up to the full-batch loss.

    Returns ``(loss, metrics)``; metrics are python floats averaged over unmasked tokens:
    ``pg_loss``, ``pg_clipfrac``, ``ppo_kl`` (k1: mean(old - new)), ``ratio_max``, ``ratio_min``,
    and ``kl_ref`` (k3) / ``entropy`` when given. Entropy is never part of the loss.
    """
    if cfg.loss_agg not in set(LossAgg):
        raise ValueError(f"loss_agg must be one of {[a.value for a in LossAgg]}, got {cfg.loss_agg!r}")
    lengths = torch.as_tensor(lengths, dtype=torch.long, device=new_logprobs.device)
    n_tok = int(lengths.sum())
    if new_logprobs.shape != (n_tok,) or old_logprobs.shape != (n_tok,):
        raise ValueError(f"packed log-probs must be [{n_tok}], got {tuple(new_logprobs.shape)}"
                         f" and {tuple(old_logprobs.shape)}")
    if advantages.shape != lengths.shape:
        raise ValueError(f"advantages {tuple(advantages.shape)} != lengths {tuple(lengths.shape)}")

    mask = (torch.ones(n_tok, dtype=torch.bool, device=new_logprobs.device)
            if loss_mask is None else loss_mask.to(torch.bool))
    zero = torch.zeros((), dtype=new_logprobs.dtype, device=new_logprobs.device)
    new = torch.where(mask, new_logprobs, zero)
    old = torch.where(mask, old_logprobs.to(new.dtype), zero)
    adv = torch.where(mask, advantages.to(new.dtype).repeat_interleave(lengths), zero)

    log_ratio = new - old
    ratio = torch.exp(log_ratio)
    pg1 = -adv * ratio
    pg2 = -adv * ratio.clamp(1.0 - cfg.clip_eps_low, 1.0 + cfg.clip_eps_high)
    tok_loss = torch.maximum(pg1, pg2)
    kl3 = None
    if ref_logprobs is not None:
        d = torch.where(mask, ref_logprobs.to(new.dtype), zero) - new
        kl3 = torch.exp(d) - d - 1.0
        if kl_coef:
            tok_loss = tok_loss + kl_coef * kl3
    elif kl_coef:
        raise ValueError("kl_coef > 0 needs ref_logprobs")
    tok_loss = torch.where(mask, tok_loss, zero)

    if cfg.loss_agg == "token_mean":
        denom = denominator if denominator is not None else max(int(mask.sum()), 1)
        loss = tok_loss.sum() / denom
    else:
        per_len = _per_sample_sum(mask.to(new.dtype), lengths)
        per_mean = _per_sample_sum(tok_loss, lengths) / per_len.clamp(min=1.0)
        has_tok = per_len > 0  # a sample with no loss tokens does not dilute the mean
        denom = denominator if denominator is not None else max(int(has_tok.sum()), 1)
        loss = torch.where(has_tok, per_mean, zero).sum() / denom

    with torch.no_grad():
        m = mask
        cnt = max(int(m.sum()), 1)
        metrics = {
            "pg_loss": float(loss.detach()),
            "pg_clipfrac": float(((pg2 > pg1) & m).sum()) / cnt,
            "ppo_kl": float(torch.where(m, old - new, zero).sum()) / cnt,
            "ratio_max": float(ratio[m].max()) if m.any() else 1.0,
            "ratio_min": float(ratio[m].min()) if m.any() else 1.0,
        }
        if kl3 is not None:
            metrics["kl_ref"] = float(torch.where(m, kl3, zero).sum()) / cnt
        if entropy is not None:
            metrics["entropy"] = float(torch.where(m, entropy.to(new.dtype), zero).sum()) / cnt
    return loss, metrics
