"""Packed prefill inputs and prefill / sampler log-probs of whole sequences, for any native model of a
family (a model called as `model(input_ids, positions, cu_seqlens, logit_rows=rows)` returning the logits of those
rows). Many sequences go in few packed calls, each of at most a token budget: the kernels are batch-invariant, so
how sequences are grouped changes no bit, only the memory a call needs (its logits are [rows, vocab])."""

from __future__ import annotations

import torch

from top_rl import kernels

PREFILL_TOKENS_PER_CALL = 16384  # the engine's prompt prefill: activations of this many tokens, logits of one per prompt
SCORE_TOKENS_PER_CALL = 8192  # scoring: logits (and their fp32 copy) of up to this many rows: 7.5 GB at vocab 151936


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


def token_budget_chunks(lengths: list[int], budget: int) -> list[range]:
    """Consecutive index ranges covering `lengths`, each summing to at most `budget` (a longer one alone)."""
    chunks, start, total = [], 0, 0
    for i, n in enumerate(lengths):
        if i > start and total + n > budget:
            chunks.append(range(start, i))
            start, total = i, 0
        total += n
    if lengths:
        chunks.append(range(start, len(lengths)))
    return chunks


def sequence_logprobs(model, sequences: list[list[int]], starts: list[int], temperature=None,
                      max_tokens: int = SCORE_TOKENS_PER_CALL):
    """Per sequence, log p(tok[j] | tok[:j]) for j in [starts[i], len): the prefill path (fp32, §6.1)
    when temperature is None, else the sampler path (§6.2) at that temperature. Packed calls of at most
    `max_tokens` tokens, each computing the logits of the scored rows only."""
    device = model.cos_sin.device
    out = []
    for chunk in token_budget_chunks([len(s) for s in sequences], max_tokens):
        seqs = [sequences[i] for i in chunk]
        ids, pos, cu = pack(seqs, device)
        rows, at = [], 0
        for s, i in zip(seqs, chunk):
            rows.append(torch.arange(at + starts[i] - 1, at + len(s) - 1))
            at += len(s)
        rows_t = torch.cat(rows).to(device)
        logits = model(ids, pos, cu, logit_rows=rows_t)
        targets = ids[rows_t + 1]
        if temperature is None:
            lp = kernels.prefill_logprobs(logits, targets)
        else:
            lp = kernels.sample_logprobs(logits, targets, temperature)
        out.extend(lp.split([len(r) for r in rows]))
    return out
