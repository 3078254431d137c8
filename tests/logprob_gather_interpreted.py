"""Run by tests/kernels/test_kernels_sglang_logprob_gather.py in a fresh process with TRITON_INTERPRET=1 (Triton wraps its
own tl.max / tl.sum for the interpreter only if the variable is set when it is first imported): the gather kernel
and SGLang's lsm_BI + gather on the same rows, results saved with torch.save to the path in argv[1]."""

from __future__ import annotations

import os
import sys

import torch

assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"

from sglang.srt.batch_invariant_ops import batch_invariant_ops as bio  # noqa: E402

from top_rl.kernels.sglang import logprob_triton as ours  # noqa: E402

VOCABS = (7, 1024, 2500)  # under one block, exactly one, a masked third block
DTYPES = (torch.float32, torch.bfloat16)


def rows(vocab, dtype, seed):
    """Random rows at scales 1..1e4, one far below zero (a max taken from the masked tail's -inf fill would show),
    -inf entries (one at an id), ids at 0 and V-1."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(6, vocab, generator=g) * torch.tensor([1.0, 30.0, 1e4, 3.0, 1.0, 5.0])[:, None]
    x[3] -= 1e4
    x[4, torch.randint(0, vocab, (vocab // 3 + 1,), generator=g)] = float("-inf")
    ids = torch.randint(0, vocab, (6,), generator=g)
    ids[0], ids[1] = 0, vocab - 1
    x[4, ids[4]] = 1.0  # row 4: -inf around a finite id; row 5: the id's own logit -inf
    x[5, ids[5]] = float("-inf")
    return x.to(dtype), ids


def main(path):
    out = {}
    for dtype in DTYPES:
        for vocab in VOCABS:
            x, ids = rows(vocab, dtype, seed=vocab)
            out[(str(dtype), vocab)] = (ours.gathered_log_softmax(x, ids),
                                        bio.log_softmax(x, dim=-1).gather(-1, ids.unsqueeze(-1)).squeeze(-1))
    for vocab in VOCABS:  # the sampler pass and its backward, at temperatures that make L / T exact
        g = torch.Generator().manual_seed(vocab)
        logits = (torch.randn(5, vocab, generator=g) * 4).to(torch.bfloat16)
        temps = torch.tensor([1.0, 0.5, 2.0, 0.25, 4.0])
        sids = torch.randint(0, vocab, (5,), generator=g)
        sids[0], sids[1] = 0, vocab - 1
        gout = torch.randn(5, generator=g).to(torch.bfloat16)
        lp, shift = ours.gathered_sampler_log_softmax(logits, temps, sids)
        grad = ours.sampler_log_softmax_grad(logits, temps, sids, shift, gout)
        out[("sampler", vocab)] = (logits, temps, sids, gout, lp, shift, grad)
    x, ids = rows(1030, torch.float32, seed=1)
    out["3d"] = (ours.gathered_log_softmax(x.reshape(2, 3, 1030), ids.reshape(2, 3)), ours.gathered_log_softmax(x, ids))
    out["bad_ids"] = ours.gathered_log_softmax(x[:2], torch.tensor([-1, 1030]))
    try:
        ours.gathered_log_softmax(x, ids[:3])
        out["shape_error"] = None
    except ValueError as e:
        out["shape_error"] = str(e)
    torch.save(out, path)


if __name__ == "__main__":
    main(sys.argv[1])
