"""TP invariance of the `sglang` backend's row-parallel linear on two GPUs (NCCL): with K split over two
ranks, the output bits equal the TP=1 linear's (one full-K mm_BI, as a TP=1 engine runs). Skipped with
fewer than two GPUs."""

from __future__ import annotations

import json
import os
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from tests.gpu._common import needs_cuda, rel_err

pytestmark = [needs_cuda, pytest.mark.gpu,
              pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs (device kind nvidia-h200-x2)")]

M, K, N = 300, 3072, 1024  # down_proj's shape


def _worker(rank: int, world: int, init: str, out_dir: str):
    from top_rl import kernels
    from top_rl.kernels import plan

    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=init, rank=rank, world_size=world)
    try:
        kernels.install(plan.build("sglang"))
        g = torch.Generator(device="cuda").manual_seed(0)  # same data on every rank
        x = torch.randn(M, K, generator=g, device="cuda").bfloat16()
        w = (torch.randn(N, K, generator=g, device="cuda") * 0.02).bfloat16()
        g_out = torch.randn(M, N, generator=g, device="cuda").bfloat16()
        x1, w1 = x.clone().requires_grad_(), w.clone().requires_grad_()
        full = kernels.linear(x1, w1)
        full.backward(g_out)
        ks = K // world
        shard = slice(rank * ks, (rank + 1) * ks)
        xs, ws = x[:, shard].clone().requires_grad_(), w[:, shard].clone().requires_grad_()
        out = kernels.row_linear(xs, ws, dist.group.WORLD)
        out.backward(g_out)
        result = {
            "forward_bitwise": bool(torch.equal(out, full)),
            "grad_x_rel_err": rel_err(xs.grad, x1.grad[:, shard]),
            "grad_w_rel_err": rel_err(ws.grad, w1.grad[:, shard]),
        }
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
            json.dump(result, f)
    finally:
        dist.destroy_process_group()


def test_row_linear_tp2_equals_tp1():
    with tempfile.TemporaryDirectory() as d:
        mp.spawn(_worker, args=(2, "file://" + os.path.join(d, "store"), d), nprocs=2)
        results = [json.load(open(os.path.join(d, f"rank{r}.json"))) for r in range(2)]
    print(results)
    for r in results:
        assert r["forward_bitwise"], results
        assert r["grad_x_rel_err"] < 1e-2 and r["grad_w_rel_err"] < 1e-2, results
