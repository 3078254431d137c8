"""The GPU trainer's optimizer step (top_rl.train.optim.FusedMasterAdamW: torch's fused AdamW on fp32 masters, clipping
through the kernel's grad_scale, a non-finite norm skipped through found_inf; no host sync) run on CPU against an
independent reference: torch's for-loop AdamW with Megatron's clip rule written out."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from top_rl.train.optim import FusedMasterAdamW
from top_rl.train.parallel import Layout

ONE_RANK = Layout(tp=1, pp=1, cp=1, dp=1, tp_rank=0, pp_rank=0, cp_rank=0, dp_rank=0)


def _cfg(clip=1.0):
    return SimpleNamespace(lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, grad_clip=clip)


def _model(seed=0):
    g = torch.Generator().manual_seed(seed)
    return {"linear.weight": torch.nn.Parameter(torch.randn(16, 8, generator=g).to(torch.bfloat16)),
            "norm.weight": torch.nn.Parameter(torch.randn(8, generator=g)),  # fp32: its own master
            "embedding.weight": torch.nn.Parameter(torch.randn(12, 8, generator=g))}


def _grads(params, scale, seed=1):
    g = torch.Generator().manual_seed(seed)
    return {n: torch.randn(p.shape, generator=g) * scale for n, p in params.items()}


def _fill(opt, grads):
    """New gradients into the optimizer's gradient buffers, in place, as DDP's backward fills main_grad."""
    for n, g in grads.items():
        opt.grads[n].copy_(g)


def _reference_step(params, grads, cfg):
    """torch.optim.AdamW (foreach=False) on fp32 copies, gradients clipped by Megatron's coefficient."""
    masters = {n: torch.nn.Parameter(p.detach().float().clone()) for n, p in params.items()}
    norm = math.sqrt(sum(float(g.double().pow(2).sum()) for g in grads.values()))
    coef = cfg.grad_clip / (norm + 1e-6)
    for n, m in masters.items():
        m.grad = grads[n] * coef if coef < 1 else grads[n].clone()
    opt = torch.optim.AdamW([{"params": [m for n, m in masters.items() if m.dim() >= 2], "weight_decay": cfg.weight_decay},
                             {"params": [m for n, m in masters.items() if m.dim() < 2], "weight_decay": 0.0}],
                            lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, foreach=False)
    opt.step()
    return masters, norm


@pytest.mark.parametrize("scale", [1e-3, 10.0], ids=["unclipped", "clipped"])
def test_step_matches_reference_adamw(scale):
    params, cfg = _model(), _cfg()
    grads = _grads(params, scale)
    ref, ref_norm = _reference_step(params, grads, cfg)  # first: the step below writes into params
    opt = FusedMasterAdamW(list(params.items()), grads, cfg, ONE_RANK)
    norm = opt.step()
    assert isinstance(norm, torch.Tensor) and float(norm) == pytest.approx(ref_norm, rel=1e-6)
    assert (ref_norm > cfg.grad_clip) == (scale > 1)  # both cases are what their names say
    for n, p in params.items():
        torch.testing.assert_close(opt.master[n].detach(), ref[n].detach(), rtol=1e-5, atol=1e-7)
        assert torch.equal(p.detach(), opt.master[n].detach().to(p.dtype)), f"{n}: the model holds its master, rounded"
    assert opt.master["norm.weight"] is params["norm.weight"]


def test_non_finite_norm_leaves_everything_as_it_was():
    params, cfg = _model(), _cfg()
    opt = FusedMasterAdamW(list(params.items()), _grads(params, 1.0), cfg, ONE_RANK)
    opt.step()  # moments and step counts exist
    before = opt.state_dict()
    model_before = {n: p.detach().clone() for n, p in params.items()}
    bad = _grads(params, 1.0, seed=2)
    bad["linear.weight"][3, 4] = float("nan")
    _fill(opt, bad)
    norm = opt.step()
    assert not math.isfinite(float(norm))
    after = opt.state_dict()
    for n, p in params.items():
        assert torch.equal(p.detach(), model_before[n]), n
    for n, m in before["master"].items():
        assert torch.equal(after["master"][n], m), n
    for key, state in before["adamw"]["state"].items():
        for k, v in state.items():
            assert torch.equal(after["adamw"]["state"][key][k], v), (key, k)


def test_state_round_trip_is_bitwise():
    cfg = _cfg()
    a_params, b_params = _model(), _model()
    a = FusedMasterAdamW(list(a_params.items()), _grads(a_params, 1.0), cfg, ONE_RANK)
    a.step()
    b = FusedMasterAdamW(list(b_params.items()), _grads(b_params, 1.0), cfg, ONE_RANK)
    with torch.no_grad():
        for n, p in b_params.items():
            p.copy_(a_params[n])  # what the trainer's shard restores beside the optimizer state
    b.load_state(a.state_dict())
    for opt in (a, b):
        _fill(opt, _grads(a_params, 1.0, seed=3))
    a.step(), b.step()
    for n in a_params:
        assert torch.equal(a.master[n], b.master[n]), n
        assert torch.equal(a_params[n], b_params[n]), n


def test_both_optimizers_build_their_parameter_groups_in_one_place(monkeypatch):
    """CpuAdamW and FusedMasterAdamW differ only in the AdamW kernel: masters and groups come from optim.adamw."""
    from top_rl.train import optim

    kernels, real = [], optim.adamw
    monkeypatch.setattr(optim, "adamw", lambda named, master, cfg, **kernel: kernels.append(kernel) or
                        real(named, master, cfg, **kernel))
    monkeypatch.setattr(optim, "groups", lambda: {})  # CpuAdamW reads the process groups only when it steps
    model = torch.nn.Module()
    for n, p in _model().items():
        model.register_parameter(n.replace(".", "_"), p)
    model.share_embeddings_and_output_weights = False
    params, cfg = _model(), _cfg()
    built = [optim.CpuAdamW(model, cfg, ONE_RANK), FusedMasterAdamW(list(params.items()), _grads(params, 1.0), cfg,
                                                                     ONE_RANK)]
    assert kernels == [{"foreach": False}, {"fused": True}]
    for opt in built:
        assert [(g["weight_decay"], [tuple(p.shape) for p in g["params"]]) for g in opt.opt.param_groups] == \
            [(0.1, [(16, 8), (12, 8)]), (0.0, [(8,)])]
        assert all(p.dtype == torch.float32 for g in opt.opt.param_groups for p in g["params"])
