"""Run by tests/test_attention_selector.py in a fresh process with TRITON_INTERPRET=1 (Triton builds its interpreter
only if the variable is set when it is first imported): SGLang's own triton extend kernel, called through the seam
(`kernels.attention` on the `sglang` backend, attention backend triton) on packed GQA sequences, several "layers"
with the same cu_seqlens; results and the number of host reads saved with torch.save to the path in argv[1]."""

from __future__ import annotations

import os
import sys

import torch

assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"

from top_rl.kernels import packed_batch  # noqa: E402
from top_rl.kernels import reference_attention  # noqa: E402
from top_rl.kernels import sglang_attention as attn  # noqa: E402

LENGTHS = (5, 1, 70, 3)  # a single token, and one sequence longer than the kernel's 64-row query block
HQ, HKV, D = 4, 2, 16


def main(path):
    attn.set_attention_backend("triton")
    g = torch.Generator().manual_seed(0)
    t = sum(LENGTHS)
    cu = torch.tensor([0, *torch.tensor(LENGTHS).cumsum(0).tolist()], dtype=torch.int32)  # the trainer's dtype
    q, k, v = (torch.randn(t, h, D, generator=g) for h in (HQ, HKV, HKV))
    reads = packed_batch.host_reads
    outs = [attn.attention(q, k, v, cu, D**-0.5) for _layer in range(3)]
    torch.save({
        "outs": outs,
        "reference": reference_attention.attention(q.double(), k.double(), v.double(), cu.long(), D**-0.5),
        "host_reads": packed_batch.host_reads - reads,
    }, path)


if __name__ == "__main__":
    main(sys.argv[1])
