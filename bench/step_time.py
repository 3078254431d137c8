"""(a) TOP step time: forward + backward of a Qwen3-0.6B-shaped model (full vocab 151936, bf16, random
weights) on one 4096-token sequence, loss = -mean prefill log-prob; `sglang` backend vs `plain` (stock
torch kernels). The plain backend hands SDPA 3-D tensors, which rules out its flash kernel; the row
"plain+flash" swaps in the same attention with 4-D inputs (flash) to show the cost of TOP against stock
kernels at their best. Run on the GPU: python bench/step_time.py"""

from __future__ import annotations

import dataclasses
import os
import sys

import torch

sys.path.insert(0, __file__.rsplit("/bench/", 1)[0])
from bench._util import table, time_ms  # noqa: E402
from tests.gpu._common import device_model  # noqa: E402
from top_rl import kernels  # noqa: E402
from top_rl.kernels import plain  # noqa: E402
from top_rl.kernels.sglang import attention as sglang_attention  # noqa: E402
from top_rl.model import pack  # noqa: E402

SEQ = 4096


def _flash_attention(q, k, v, cu_seqlens, scale):
    group = q.shape[1] // k.shape[1]
    b = cu_seqlens.tolist()
    outs = []
    for s, e in zip(b[:-1], b[1:]):
        qs, ks, vs = (t[s:e].transpose(0, 1).unsqueeze(0) for t in (q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)))
        with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.FLASH_ATTENTION):
            o = torch.nn.functional.scaled_dot_product_attention(qs, ks, vs, is_causal=True, scale=scale)
        outs.append(o[0].transpose(0, 1))
    return torch.cat(outs, 0)


def main():
    from top_rl.kernels import plan

    sglang_attention.set_attention_backend(os.environ.get(plan.ATTENTION_ENV, "triton"))
    model = device_model(seed=0, vocab_size=151936)
    g = torch.Generator().manual_seed(0)
    ids, pos, cu = pack([torch.randint(3, 151936, (SEQ,), generator=g).tolist()], "cuda")
    rows, stock_attention = [], plain.attention
    for name in ("sglang", "plain", "plain+flash"):
        if name == "plain+flash":
            plain.attention = _flash_attention  # the backend is the module: kernels.attention calls plain.attention
        with kernels.use_plan(dataclasses.replace(plan.current(), backend=name.split("+")[0])):
            def fwd():
                with torch.no_grad():
                    kernels.prefill_logprobs(model(ids, pos, cu)[:-1], ids[1:])

            def fwd_bwd():
                loss = -kernels.prefill_logprobs(model(ids, pos, cu)[:-1], ids[1:]).mean()
                loss.backward()
                model.zero_grad(set_to_none=True)

            t_f = time_ms(fwd)
            torch.cuda.reset_peak_memory_stats()
            t_fb = time_ms(fwd_bwd)
            rows.append([name, t_f, t_fb, SEQ / t_fb * 1e3, torch.cuda.max_memory_allocated() / 2**30])
    plain.attention = stock_attention
    ratio = rows[0][2] / rows[1][2]
    print(table(f"TOP step, Qwen3-0.6B shape, one {SEQ}-token sequence",
                ["backend", "fwd ms", "fwd+bwd ms", "tokens/s", "peak GiB"], rows))
    print(f"sglang / plain fwd+bwd time ratio: {ratio:.2f}x; sglang / plain+flash: {rows[0][2] / rows[2][2]:.2f}x")


if __name__ == "__main__":
    main()
