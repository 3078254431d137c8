"""Where a trainer step spends host time, for when the GPU idles: the bench's GPU-busy ratio (bench/trainer_step.py)
can be fine while the wall-clock one is not, because the host does not keep the GPU's queue full.

    PYTHONPATH=... python bench/host_time.py --impl top|stock [--model qwen3-0.6b] [--recompute on|off]
    python bench/host_time.py --cpu-smoke --impl top|stock     a tiny model on CPU: checks the script, not speed

Prints, for one worker's trainer (bench/_trainer_worker.py builds it, same batch and loss): the synced step time, the
host time to enqueue a step, the synchronizing CUDA calls of a step and of its optimizer step alone (torch's sync
debug mode: each one drains the queue, and the GPU then idles while the host refills it) by call site, and the
Python functions taking the most host time in a step (cProfile).
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import os
import pstats
import sys
import time
import warnings

sys.path.insert(0, __file__.rsplit("/bench/", 1)[0])

import torch  # noqa: E402

from bench import _trainer_worker as tw  # noqa: E402
from bench._trainer_common import MODELS, make_batch, make_loss_fn, median  # noqa: E402


def _setup(impl: str, device) -> None:
    cuda = device.type == "cuda"
    if impl == "top":
        from top_rl import kernels
        from top_rl.kernels import plan

        kernels.install(plan.build("sglang" if cuda else "reference",
                                   attention=os.environ.get(plan.ATTENTION_ENV, "triton") if cuda else None))
    else:
        from bench import _stock_attention, _stock_gpt

        _stock_attention.use("flash" if cuda else "math")
        _stock_gpt.prepare(device)


def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def optimizer_of(runner):
    """The object whose `step()` is the trainer's optimizer step (the TOP trainer's or the stock runner's)."""
    return runner.trainer.optimizer if hasattr(runner, "trainer") else runner.opt


def _syncs(step, device, optimizer) -> tuple[collections.Counter, collections.Counter] | None:
    """Synchronizing CUDA calls by call site: (the whole step, inside `optimizer.step()` alone)."""
    if device.type != "cuda":
        return None
    sites, in_optimizer = collections.Counter(), collections.Counter()
    spans = []  # (first, end) indices into `seen` of the warnings raised inside optimizer.step()
    inner = optimizer.step

    def counted_step(*a, **k):
        first = len(seen)
        try:
            return inner(*a, **k)
        finally:
            spans.append((first, len(seen)))

    torch.cuda.set_sync_debug_mode("warn")
    optimizer.step = counted_step
    try:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            step()
            torch.cuda.synchronize()
    finally:
        del optimizer.step  # back to the class's method
        torch.cuda.set_sync_debug_mode("default")
    inside = {i for first, end in spans for i in range(first, end)}
    for i, w in enumerate(seen):
        if "synchroniz" in str(w.message):
            site = f"{w.filename.split('site-packages/')[-1].split('/work/')[-1]}:{w.lineno}"
            sites[site] += 1
            if i in inside:
                in_optimizer[site] += 1
    return sites, in_optimizer


def main(argv=None) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--impl", choices=("top", "stock"), default="top")
    p.add_argument("--model", default="qwen3-0.6b")
    p.add_argument("--recompute", choices=("on", "off"), default="on")
    p.add_argument("--tokens", type=int, default=16384)
    p.add_argument("--top", type=int, default=25, help="rows of the cProfile table")
    p.add_argument("--cpu-smoke", action="store_true", help="tiny model on CPU: checks the script, not speed")
    args = p.parse_args(argv)
    if args.cpu_smoke:
        args.model, args.tokens = "tiny", 512
    device = torch.device("cpu" if args.cpu_smoke else "cuda")
    _setup(args.impl, device)
    cfg = MODELS[args.model]
    batch, adv = make_batch(cfg, args.tokens)
    loss_fn = make_loss_fn(batch, adv)
    runner = tw.RUNNERS[args.impl](cfg, args.tokens, args.recompute == "on", device)

    def step():
        runner.step(batch, loss_fn)

    step()
    _sync(device)
    walls, hosts = [], []
    for _ in range(3):
        t0 = time.perf_counter()
        step()
        t1 = time.perf_counter()
        _sync(device)
        hosts.append((t1 - t0) * 1e3)
        walls.append((time.perf_counter() - t0) * 1e3)
    print(f"# host time, {args.model} {args.impl}, recompute {args.recompute}\n")
    print("| step ms (synced) | host ms to enqueue (until the step returns) |\n|---|---|")
    print(f"| {median(walls):.1f} | {median(hosts):.1f} |\n")

    counts = _syncs(step, device, optimizer_of(runner))
    if counts is None:
        print("### synchronizing CUDA calls in one step: none on CPU")
    else:
        sites, in_optimizer = counts
        print(f"### synchronizing CUDA calls in one step: {sum(sites.values())}, of them in the optimizer step: "
              f"{sum(in_optimizer.values())}\n\n| call site | calls | in the optimizer step |\n|---|---|---|")
        for site, n in sites.most_common(15):
            print(f"| {site} | {n} | {in_optimizer[site]} |")

    prof = cProfile.Profile()
    prof.enable()
    step()
    _sync(device)
    prof.disable()
    stats = pstats.Stats(prof)
    rows = sorted(stats.stats.items(), key=lambda kv: -kv[1][2])[:args.top]  # by own (total minus callees) time
    print(f"\n### Python functions by own host time, one step (cProfile)\n\n| function | calls | own ms | cumulative ms |")
    print("|---|---|---|---|")
    for (file, line, fn), (_cc, nc, tt, ct, _callers) in rows:
        print(f"| {file.split('site-packages/')[-1].split('/work/')[-1]}:{line}({fn}) | {nc} | {tt * 1e3:.1f} | "
              f"{ct * 1e3:.1f} |")


if __name__ == "__main__":
    main()
