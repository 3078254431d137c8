"""Shared bits of the GPU benchmarks: CUDA-event timing and plain-text tables."""

from __future__ import annotations

import statistics

import torch


def time_ms(fn, warmup: int = 2, iters: int = 5) -> float:
    """Median wall time of fn() in ms, by CUDA events, after warm-up (compiles stay out of the numbers)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def table(title: str, header: list[str], rows: list[list]) -> str:
    cells = [header] + [[f"{c:.3g}" if isinstance(c, float) else str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    line = lambda r: "| " + " | ".join(c.rjust(w) for c, w in zip(r, widths)) + " |"  # noqa: E731
    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([f"### {title}", "", line(cells[0]), sep] + [line(r) for r in cells[1:]]) + "\n"
