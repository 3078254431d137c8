"""GRPO advantages: each sample's reward relative to the other samples of its prompt."""

from __future__ import annotations


import torch


def grpo_advantages(rewards: torch.Tensor, n_samples: int, normalize_std: bool = True,
                    eps: float = 1e-6) -> torch.Tensor:
    """Group-normalised advantages.

    ``rewards`` is 1-D ``[n_prompts * n_samples]``, laid out prompt-major (the samples of prompt p
    are ``rewards[p*n_samples:(p+1)*n_samples]``). Returns a float32 tensor of the same shape:
    ``(r - mean_group) / (std_group + eps)`` or just ``r - mean_group``. The std is the unbiased one
    (as GRPO/verl/miles use ``torch.std``); a group of one sample has advantage 0.
    """
    r = torch.as_tensor(rewards, dtype=torch.float32).flatten()
    if n_samples < 1 or r.numel() % n_samples != 0:
        raise ValueError(f"{r.numel()} rewards do not split into groups of {n_samples}")
    if not torch.isfinite(r).all():
        # A NaN reward would silently spread to its whole group; say which one instead.
        bad = int((~torch.isfinite(r)).nonzero()[0])
        raise ValueError(f"non-finite reward at sample {bad}: {r[bad].item()}")
    g = r.view(-1, n_samples)
    adv = g - g.mean(dim=1, keepdim=True)
    if normalize_std and n_samples > 1:
        denom = g.std(dim=1, keepdim=True) + eps
        # select, don't divide, for all-equal groups: eps=0 must still give 0, not 0/0 = NaN
        adv = torch.where(denom > 0, adv / denom.clamp(min=torch.finfo(adv.dtype).tiny), 0.0)
    elif n_samples == 1:
        adv = torch.zeros_like(g)
    return adv.flatten()
