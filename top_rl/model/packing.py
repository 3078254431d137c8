"""Packed prefill inputs and prefill / sampler log-probs of whole sequences, for any native model of a
family (a model called as `model(input_ids, positions, cu_seqlens)` returning logits)."""

from __future__ import annotations

import torch

from top_rl import kernels


def packed_positions(cu_seqlens: torch.Tensor) -> torch.Tensor:
    """Positions restarting at 0 for each packed sequence."""
    lengths = cu_seqlens[1:] - cu_seqlens[:-1]
    starts = torch.repeat_interleave(cu_seqlens[:-1], lengths)
    return torch.arange(int(cu_seqlens[-1]), device=cu_seqlens.device) - starts


def pack(sequences: list[list[int]], device=None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(input_ids, positions, cu_seqlens) for a list of token lists."""
    lengths = torch.tensor([len(s) for s in sequences], dtype=torch.long)
    cu = torch.zeros(len(sequences) + 1, dtype=torch.long)
    cu[1:] = torch.cumsum(lengths, 0)
    ids = torch.tensor([t for s in sequences for t in s], dtype=torch.long)
    return ids.to(device), packed_positions(cu).to(device), cu.to(device)


def sequence_logprobs(model, sequences: list[list[int]], starts: list[int], temperature=None):
    """Per sequence, log p(tok[j] | tok[:j]) for j in [starts[i], len): the prefill path (fp32, §6.1)
    when temperature is None, else the sampler path (§6.2) at that temperature."""
    ids, pos, cu = pack(sequences, model.cos_sin.device)
    logits = model(ids, pos, cu)
    rows, targets = [], []
    bounds = cu.tolist()
    for i, (s, e) in enumerate(zip(bounds[:-1], bounds[1:])):
        rows.append(torch.arange(s + starts[i] - 1, e - 1))
        targets.append(ids[s + starts[i] : e])
    rows_t, targets_t = torch.cat(rows), torch.cat(targets)
    if temperature is None:
        lp = kernels.prefill_logprobs(logits[rows_t], targets_t)
    else:
        lp = kernels.sample_logprobs(logits[rows_t], targets_t, temperature)
    return list(lp.split([len(r) for r in rows]))
