"""What the trainer scores, and how a batch becomes packed THD micro-batches on each rank.

A `TrainSequence` is one token sequence whose tokens[prompt_len:] are scored: entry j of its log-prob
tensor is log p(tokens[prompt_len + j] | tokens[:prompt_len + j]), computed by the engine's formula for
its kind (temperature None: the prefill path, fp32; a float: the sampler path at that temperature, in
the compute dtype). Every rank receives the whole batch (SPMD); `plan` picks this data-parallel rank's
samples and cuts them into micro-batches, `pack_micro_batch` lays one micro-batch out for this context-parallel rank.
Packing never changes a sample's bits: every seam kernel is row/sequence-invariant.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from megatron.core.packed_seq_params import PackedSeqParams as MegatronPackedSeqParams

from top_rl.train.sequence import TrainSequence


def plan(batch: Sequence[TrainSequence], *, dp_rank: int, dp_size: int, micro_batch_size: int | None,
         micro_batch_tokens: int | None) -> list[list[int]]:
    """This DP rank's micro-batches as lists of batch indices. Samples go round-robin over DP ranks and
    keep their batch order; a micro-batch holds `micro_batch_size` samples, or as many consecutive
    samples as fit in `micro_batch_tokens` (a longer sample gets a micro-batch of its own)."""
    mine = list(range(dp_rank, len(batch), dp_size))
    if micro_batch_tokens is None:
        size = micro_batch_size or len(mine) or 1
        return [mine[i : i + size] for i in range(0, len(mine), size)]
    out: list[list[int]] = []
    used = 0
    for i in mine:
        n = len(batch[i].tokens)
        if out and used + n <= micro_batch_tokens:
            out[-1].append(i)
            used += n
        else:
            out.append([i])
            used = n
    return out


@dataclass
class PackedSeqParams(MegatronPackedSeqParams):
    """Megatron's THD parameters plus each local token's position within its own sequence (RoPE)."""

    positions: torch.Tensor | None = None


@dataclass
class MicroBatch:
    """One micro-batch as this CP rank sees it. With CP = c > 1 every sequence is padded to a multiple
    of 2c and split into 2c chunks; rank r holds chunks r and 2c-1-r (the load-balanced layout
    Megatron's THD RoPE expects, docs/megatron.md §8), so cu_seqlens describe the padded global sequences."""

    indices: list[int]
    input_ids: torch.Tensor  # [1, T_local] this rank's tokens
    params: PackedSeqParams
    num_local_tokens: int
    # Scored rows on this rank, split by kind; `*_dest` index the micro-batch's flat scored vector
    # (samples in order, each sample's scored positions in order).
    prefill_rows: torch.Tensor
    prefill_targets: torch.Tensor
    prefill_dest: torch.Tensor
    sample_rows: torch.Tensor
    sample_targets: torch.Tensor
    sample_temps: torch.Tensor
    sample_dest: torch.Tensor
    sample_gate_prefill: torch.Tensor  # bool per sample row: its sample also wants the fp32 prefill value
    num_scored: int  # length of the flat vector (all CP ranks together)
    scored_sizes: list[int]  # per sample


def cp_positions(cu: Sequence[int], cp_size: int, cp_rank: int) -> list[int]:
    """Flat positions (into the padded packed sequences described by `cu`) that CP rank `cp_rank`
    holds, in its local order: per sequence, chunks r and 2c-1-r of 2c equal chunks."""
    if cp_size == 1:
        return list(range(cu[-1]))
    unit, out = 2 * cp_size, []
    for start, end in zip(cu[:-1], cu[1:]):
        c = (end - start) // unit
        out += range(start + cp_rank * c, start + (cp_rank + 1) * c)
        out += range(start + (unit - 1 - cp_rank) * c, start + (unit - cp_rank) * c)
    return out


def pack_micro_batch(batch: Sequence[TrainSequence], indices: list[int], *, cp_size: int = 1, cp_rank: int = 0,
         device=None) -> MicroBatch:
    seqs = [batch[i] for i in indices]
    unit = 2 * cp_size if cp_size > 1 else 1
    lengths = [len(s.tokens) for s in seqs]
    padded = [-(-n // unit) * unit for n in lengths]  # pad tokens trail each sequence: causal rows ignore them
    cu = [0]
    for n in padded:
        cu.append(cu[-1] + n)
    local_pos = cp_positions(cu, cp_size, cp_rank)  # global flat positions held by this rank
    flat_tokens = []
    for s, n in zip(seqs, padded):
        flat_tokens += list(s.tokens) + [0] * (n - len(s.tokens))
    local_index = {p: i for i, p in enumerate(local_pos)}
    seq_start = [start for start, n in zip(cu[:-1], padded) for _ in range(n)]
    positions = [p - seq_start[p] for p in local_pos]

    rows = {"prefill": ([], [], []), "sample": ([], [], [])}
    temps: list[float] = []
    gate_prefill: list[bool] = []
    dest = 0
    sizes = []
    for s, start in zip(seqs, cu[:-1]):
        kind = "prefill" if s.temperature is None else "sample"
        r, t, d = rows[kind]
        for j in range(s.prompt_len - 1, len(s.tokens) - 1):  # row j predicts token j + 1
            li = local_index.get(start + j)
            if li is not None:
                r.append(li)
                t.append(s.tokens[j + 1])
                d.append(dest)
                if kind == "sample":
                    temps.append(s.temperature)
                    gate_prefill.append(s.gate_prefill)
            dest += 1
        sizes.append(s.num_scored)

    def lt(x):
        return torch.tensor(x, dtype=torch.long, device=device)

    cu_t = torch.tensor(cu, dtype=torch.int32, device=device)
    # max_seqlen must be the longest (padded) sequence, never the total: docs/megatron.md §8 pitfall.
    max_len = max(padded)
    params = PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu_t, cu_seqlens_kv=cu_t, max_seqlen_q=max_len,
                             max_seqlen_kv=max_len, positions=lt(positions))
    return MicroBatch(
        indices=list(indices),
        input_ids=lt([flat_tokens[p] for p in local_pos]).unsqueeze(0),
        params=params,
        num_local_tokens=len(local_pos),
        prefill_rows=lt(rows["prefill"][0]), prefill_targets=lt(rows["prefill"][1]), prefill_dest=lt(rows["prefill"][2]),
        sample_rows=lt(rows["sample"][0]), sample_targets=lt(rows["sample"][1]), sample_dest=lt(rows["sample"][2]),
        sample_temps=torch.tensor(temps, dtype=torch.float32, device=device),
        sample_gate_prefill=torch.tensor(gate_prefill, dtype=torch.bool, device=device),
        num_scored=dest,
        scored_sizes=sizes,
    )
