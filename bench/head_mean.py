"""mean_BI (SGLang's mean_kernel, one program per row) vs `_head_mean` (32 rows per program, the same bits:
top_rl/kernels/sglang/fused_triton.py) on the per-head q/k norm rows of a 16k-token Qwen3 batch. Prints a table."""

from __future__ import annotations

import torch

from top_rl.kernels.sglang import backend as sg
from top_rl.kernels.sglang import fused_triton as ft


def _ms(fn, reps=50):
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps


def main():
    mean = sg.ops().mean
    print("| rows x 128 (norm) | mean_BI ms | _head_mean ms | speedup | same bits |")
    print("|---|---|---|---|---|")
    for rows, what in ((16384 * 16, "q, Qwen3-0.6B/4B at 16k tokens"), (16384 * 8, "k"), (16384 * 32, "q, Qwen3-8B+")):
        sq = torch.randn(rows, 128, device="cuda").square()
        a, b = _ms(lambda: mean(sq, -1, keepdim=True)), _ms(lambda: ft.head_mean(sq))
        same = torch.equal(mean(sq, -1, keepdim=True).view(torch.int32), ft.head_mean(sq).view(torch.int32))
        print(f"| {rows} ({what}) | {a:.3f} | {b:.3f} | {a / b:.1f}x | {same} |")


if __name__ == "__main__":
    main()
