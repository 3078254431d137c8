"""Log-probs from the last stage's hidden states, by the engine's own formula (never Megatron's CE).

Runs as GPTModel's `output_processor`: only the scored rows go through the LM head (rows are
batch-invariant, so this equals the engine's full-logits-then-select), the vocab-parallel logits are
all-gathered across TP before any softmax (backward: this rank's slice, since the loss is replicated
on every TP rank), then `kernels.prefill_logprobs` / `kernels.sample_logprobs` compute exactly the
engine's number. With context parallelism each CP rank scores the rows it holds and the flat vector
is summed over the CP group (one non-zero contribution per entry: exact).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from top_rl import kernels
from top_rl.train.batch import MicroBatch

LOGIT_ROWS = 4096  # scored rows per LM-head call: caps the [rows, vocab] logits of long responses


class _GatherVocab(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group, ctx.rank, ctx.width = group, dist.get_rank(group), x.shape[-1]
        parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, x.contiguous(), group=group)
        return torch.cat(parts, dim=-1)

    @staticmethod
    def backward(ctx, g):
        return g.narrow(-1, ctx.rank * ctx.width, ctx.width).contiguous(), None


class _SumOverGroup(torch.autograd.Function):
    """Forward: all-reduce sum (exact here: each entry is non-zero on one rank). Backward: identity,
    because every rank then computes the same replicated loss from the summed vector."""

    @staticmethod
    def forward(ctx, x, group):
        out = x.to(torch.float64)
        dist.all_reduce(out, group=group)
        return out.to(x.dtype)

    @staticmethod
    def backward(ctx, g):
        return g, None


def gather_vocab(logits: torch.Tensor, tp_group) -> torch.Tensor:
    if tp_group is None or dist.get_world_size(tp_group) == 1:
        return logits
    return _GatherVocab.apply(logits, tp_group)


def scored_logprobs(hidden: torch.Tensor, mb: MicroBatch, output_layer, output_weight, tp_group,
                    cp_group) -> tuple[torch.Tensor, torch.Tensor]:
    """(flat, gate) for the micro-batch. `flat`: the fp32 vector of scored log-probs, each row by its
    sample's kind (sampler-kind entries hold compute-dtype values widened exactly to fp32;
    `split_per_sample` narrows them back); gradients flow through it. `gate` (no grad): the numbers the
    TOP gate compares, from the same logits - `flat`'s values, except the rows of `gate_prefill` samples,
    which hold the fp32 prefill log-probs (the engine re-scored those samples; the loss still differentiates
    the sampler path). So the training forward is the gate's recompute: no second forward."""
    h = hidden.reshape(hidden.shape[0], -1)
    flat = hidden.new_zeros(mb.num_scored, dtype=torch.float32)
    gate_prefill: list[tuple[torch.Tensor, torch.Tensor]] = []  # (dest, fp32 prefill values)
    for rows, targets, dest, temps in ((mb.prefill_rows, mb.prefill_targets, mb.prefill_dest, None),
                                       (mb.sample_rows, mb.sample_targets, mb.sample_dest, mb.sample_temps)):
        for lo in range(0, rows.numel(), LOGIT_ROWS):  # bounded [rows, vocab] logits; rows are invariant
            sl = slice(lo, lo + LOGIT_ROWS)
            logits, _ = output_layer(h.index_select(0, rows[sl]), weight=output_weight)
            logits = gather_vocab(logits, tp_group)
            if temps is None:
                lp = kernels.prefill_logprobs(logits, targets[sl])
            else:
                lp = kernels.sample_logprobs(logits, targets[sl], temps[sl])
                want = mb.sample_gate_prefill[sl]
                n_want = int(want.sum())  # one host read; all rows (logprob_source=prefill): no [rows, vocab] copy
                if n_want:
                    with torch.no_grad():  # row-invariant log-softmax: selecting rows first changes no bit
                        pick = slice(None) if n_want == want.numel() else want
                        gate_prefill.append((dest[sl][pick], kernels.prefill_logprobs(logits.detach()[pick],
                                                                                       targets[sl][pick])))
            flat = flat.index_put((dest[sl],), lp.to(torch.float32))
    gate = flat.detach().clone()
    for d, values in gate_prefill:
        gate[d] = values.to(torch.float32)
    if cp_group is not None and dist.get_world_size(cp_group) > 1:
        flat = _SumOverGroup.apply(flat, cp_group)
        gate = _SumOverGroup.apply(gate, cp_group)
    return flat, gate


def split_per_sample(flat: torch.Tensor, batch, indices, compute_dtype) -> list[torch.Tensor]:
    """Per-sample tensors in each sample's own dtype: fp32 (prefill) or the compute dtype (sampler)."""
    out = []
    for part, i in zip(flat.split([batch[i].num_scored for i in indices]), indices):
        out.append(part if batch[i].temperature is None else part.to(compute_dtype))
    return out


def make_output_processor(tp_group, cp_group):
    """GPTModel output_processor returning (flat, gate); the micro-batch travels as `output_processor_context`."""

    def processor(*, hidden_states, output_layer, output_weight, context, **_):
        return scored_logprobs(hidden_states, context, output_layer, output_weight, tp_group, cp_group)

    return processor
