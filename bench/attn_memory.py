"""(c) Peak memory of attention forward+backward (sglang backend: engine forward kernel, aten
memory-efficient backward) for one sequence of 1k, 8k and 32k tokens, Qwen3-0.6B heads (16 q / 8 kv,
d=128, bf16). Linear growth = constant bytes per token. Run on the GPU: python bench/attn_memory.py"""

from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, __file__.rsplit("/bench/", 1)[0])
from bench._util import table, time_ms  # noqa: E402
from top_rl import kernels  # noqa: E402

HQ, HKV, D = 16, 8, 128


def measure(t: int):
    g = torch.Generator(device="cuda").manual_seed(t)
    q, k, v = (torch.randn(t, h, D, generator=g, device="cuda").bfloat16().requires_grad_() for h in (HQ, HKV, HKV))
    cu = torch.tensor([0, t], device="cuda")
    go = torch.randn(t, HQ, D, generator=g, device="cuda").bfloat16()

    def step():
        out = kernels.attention(q, k, v, cu, D**-0.5)
        out.backward(go)
        q.grad = k.grad = v.grad = None

    step()  # compile
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    return peak, time_ms(step, warmup=1, iters=3)


def main():
    from top_rl.kernels import plan

    rows = []
    with kernels.use_plan(plan.build("sglang", attention=os.environ.get(plan.ATTENTION_ENV, "triton"))):
        for t in (1024, 8192, 32768):
            peak, ms = measure(t)
            rows.append([t, peak / 2**20, peak / t, ms])
    base = rows[0][2]
    for r in rows:
        r.append(r[2] / base)
    dense = 32768 * 32768 * HQ * 2 / 2**30
    print(table("attention fwd+bwd, one sequence: peak memory above inputs",
                ["tokens", "peak MiB", "bytes/token", "fwd+bwd ms", "bytes/token vs 1k"], rows))
    print(f"(for scale: one dense bf16 score matrix at 32k tokens would be {dense:.0f} GiB)")


if __name__ == "__main__":
    main()
