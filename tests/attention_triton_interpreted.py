"""Run by tests/kernels/test_attention_selector.py in a fresh process with TRITON_INTERPRET=1 (Triton builds its interpreter
only if the variable is set when it is first imported): SGLang's own triton extend kernel, called through the seam
(`kernels.attention` on the `sglang` backend, attention backend triton) on packed GQA sequences, several "layers"
with the same cu_seqlens, and its decode kernel (`kernels.decode_attention`) over a [rows, max_len] cache, with the
kv indices built on the device and with the host-built ones; results and the number of host reads saved with
torch.save to the path in argv[1]."""

from __future__ import annotations

import os
import sys

import torch

assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"

from top_rl.kernels import packed_batch  # noqa: E402
from top_rl.kernels import reference_attention  # noqa: E402
from top_rl.kernels.sglang import attention as attn  # noqa: E402

LENGTHS = (5, 1, 70, 3)  # a single token, and one sequence longer than the kernel's 64-row query block
DECODE_LENGTHS = (3, 1, 300, 70)  # 300: two KV splits of 256
HQ, HKV, D = 4, 2, 16


def main(path):
    attn.set_attention_backend("triton")
    g = torch.Generator().manual_seed(0)
    t = sum(LENGTHS)
    cu = torch.tensor([0, *torch.tensor(LENGTHS).cumsum(0).tolist()], dtype=torch.int32)  # the trainer's dtype
    q, k, v = (torch.randn(t, h, D, generator=g) for h in (HQ, HKV, HKV))
    reads = packed_batch.host_reads
    outs = [attn.attention(q, k, v, cu, D**-0.5) for _layer in range(3)]
    lengths = torch.tensor(DECODE_LENGTHS)
    b, max_len = len(DECODE_LENGTHS), max(DECODE_LENGTHS) + 5
    dq, kc, vc = (torch.randn(*shape, generator=g) for shape in ((b, HQ, D), (b, max_len, HKV, D), (b, max_len, HKV, D)))
    decode = attn.decode_attention(dq, kc, vc, lengths, D**-0.5)
    device_built = attn.decode_kv_indices
    attn.decode_kv_indices = lambda indptr, rows, stride: attn.token_indices((indptr[1:] - indptr[:-1]).long(), stride)
    decode_host_indices = attn.decode_attention(dq, kc, vc, lengths.clone(), D**-0.5)  # a new tensor: new metadata
    attn.decode_kv_indices = device_built
    torch.save({
        "outs": outs,
        "reference": reference_attention.attention(q.double(), k.double(), v.double(), cu.long(), D**-0.5),
        "host_reads": packed_batch.host_reads - reads,
        "decode": decode, "decode_host_indices": decode_host_indices,
        "decode_reference": reference_attention.decode_attention(dq.double(), kc.double(), vc.double(), lengths,
                                                                 D**-0.5),
    }, path)


if __name__ == "__main__":
    main(sys.argv[1])
