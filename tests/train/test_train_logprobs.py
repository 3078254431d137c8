"""The trainer's scored log-probs (top_rl/train/logprobs.py): the loss's vector and the gate's, per sample kind."""

from __future__ import annotations

import pytest
import torch

from top_rl import kernels
from top_rl.train import TrainSequence
from top_rl.train.batch import pack_micro_batch
from top_rl.train.logprobs import scored_logprobs


@pytest.mark.parametrize("wanted", [(True, True), (True, False), (False, False)], ids=["all", "mixed", "none"])
def test_gate_values_of_gate_prefill_samples(wanted):
    """scored_logprobs' gate vector: the fp32 prefill log-probs for samples that want them (all of a chunk's rows:
    no row selection; some: a mask), the sampler-path values elsewhere; `flat` is always the sampler path."""
    torch.manual_seed(0)
    vocab, hidden = 50, 8
    batch = [TrainSequence(torch.randint(0, vocab, (n,)).tolist(), 2, 0.7, gate_prefill=w)
             for n, w in zip((6, 9), wanted)]
    mb = pack_micro_batch(batch, [0, 1])
    h = torch.randn(mb.num_local_tokens, 1, hidden)
    weight = torch.randn(vocab, hidden)
    flat, gate = scored_logprobs(h, mb, lambda x, weight: (x @ weight.t(), None), weight, None, None)
    logits = h.reshape(-1, hidden).index_select(0, mb.sample_rows) @ weight.t()
    sampler = kernels.sample_logprobs(logits, mb.sample_targets, mb.sample_temps).float()
    prefill = kernels.prefill_logprobs(logits, mb.sample_targets).float()
    assert torch.equal(flat[mb.sample_dest], sampler)
    want = mb.sample_gate_prefill
    assert int(want.sum()) == sum(s.num_scored for s, w in zip(batch, wanted) if w)
    assert torch.equal(gate[mb.sample_dest][want], prefill[want])
    assert torch.equal(gate[mb.sample_dest][~want], sampler[~want])
