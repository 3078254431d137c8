"""trainer.offload_during_rollout (top_rl.train.optim): the GPU optimizer's fp32 masters and AdamW state parked in host
memory between steps and DDP's gradient buffers freed, without changing any tensor's identity. Run on CPU: the
"device" tensors are CPU tensors whose storage is released and restored exactly as a CUDA one's would be."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from top_rl.train.offload import HostCopies
from top_rl.train.optim import FusedMasterAdamW, GpuAdamW

from tests.train.test_fused_adamw import ONE_RANK, _cfg, _fill, _grads, _model


def _opt(seed=0):
    params = _model(seed)
    return params, FusedMasterAdamW(list(params.items()), _grads(params, 1.0), _cfg(), ONE_RANK)


def _state_tensors(opt):
    return [(i, k, v) for i, s in enumerate(opt.opt.state.values()) for k, v in sorted(s.items()) if torch.is_tensor(v)]


def _snapshot(opt):
    return ({n: m.detach().clone() for n, m in opt.master.items()},
            [(i, k, v.clone()) for i, k, v in _state_tensors(opt)])


def _assert_same_values(opt, snap):
    masters, state = snap
    for n, m in opt.master.items():
        assert torch.equal(m.detach(), masters[n]), n
    now = _state_tensors(opt)
    assert [(i, k) for i, k, _ in now] == [(i, k) for i, k, _ in state]
    for (_, k, v), (_, _, was) in zip(now, state):
        assert torch.equal(v, was), k


def test_round_trip_is_bitwise_and_keeps_every_tensor_object():
    params, opt = _opt()
    opt.step()  # moments and step counts exist
    opt.step()
    snap = _snapshot(opt)
    masters = dict(opt.master)
    state = [v for _, _, v in _state_tensors(opt)]
    assert {k for _, k, _ in _state_tensors(opt)} == {"exp_avg", "exp_avg_sq", "step"}

    opt.offload()
    assert opt.offloaded
    assert opt.master["linear.weight"].untyped_storage().nbytes() == 0  # the bf16 weight's fp32 master: parked
    assert all(v.untyped_storage().nbytes() == 0 for v in state)  # both moments and the step counts of every param
    for n in ("norm.weight", "embedding.weight"):  # fp32: the model's own weights (what the push reads) stay
        assert opt.master[n] is params[n] and params[n].untyped_storage().nbytes() == params[n].numel() * 4
    assert params["linear.weight"].untyped_storage().nbytes() > 0  # the bf16 model weight stays
    opt.offload()  # idempotent

    opt.onload()
    assert not opt.offloaded
    opt.onload()  # idempotent
    assert all(opt.master[n] is masters[n] for n in masters)
    assert [v for _, _, v in _state_tensors(opt)] == state and all(a is b for a, b in zip(
        [v for _, _, v in _state_tensors(opt)], state))
    _assert_same_values(opt, snap)


def test_a_step_after_offload_and_onload_equals_one_without():
    pa, a = _opt()
    pb, b = _opt()
    for opt in (a, b):
        opt.step()
    for cycle in range(2):
        b.offload()
        b.onload()
        g = _grads(pa, 1.0, seed=10 + cycle)
        _fill(a, g)
        _fill(b, g)
        assert torch.equal(a.step(), b.step())
    for n in pa:
        assert torch.equal(pa[n].detach(), pb[n].detach()), n
        assert torch.equal(a.master[n].detach(), b.master[n].detach()), n
    _assert_same_values(b, _snapshot(a))


def test_a_step_while_offloaded_is_refused_and_changes_nothing():
    params, opt = _opt()
    opt.step()
    before = {n: p.detach().clone() for n, p in params.items()}
    opt.offload()
    with pytest.raises(RuntimeError, match=r"top-rl: an optimizer step with the optimizer state offloaded.*onload"):
        opt.step()
    opt.onload()
    for n, p in params.items():
        assert torch.equal(p.detach(), before[n]), n
    opt.step()  # and steps again once back


def test_the_first_offload_before_any_step_parks_the_masters_only():
    params, opt = _opt()
    opt.offload()  # before the first step: AdamW has no state yet (it makes it lazily)
    assert opt.master["linear.weight"].untyped_storage().nbytes() == 0 and not opt.opt.state
    opt.onload()
    assert torch.equal(opt.master["linear.weight"].detach(), params["linear.weight"].detach().float())
    opt.step()


def test_a_checkpoint_taken_while_offloaded_is_the_resident_one_and_loads():
    _, opt = _opt()
    opt.step()
    resident = opt.state_dict()
    opt.offload()
    parked = opt.state_dict()  # from the host copies: no device memory
    assert opt.offloaded
    assert parked["master"].keys() == resident["master"].keys()
    for n in resident["master"]:
        assert torch.equal(parked["master"][n], resident["master"][n])
    for k, s in resident["adamw"]["state"].items():
        for name, v in s.items():
            assert torch.equal(parked["adamw"]["state"][k][name], v), name
    assert parked["adamw"]["param_groups"] == resident["adamw"]["param_groups"]
    hosts = {id(h) for _, h, _ in opt.host.parked}  # the host copies themselves: no second copy in host memory
    assert all(id(v) in hosts for s in parked["adamw"]["state"].values() for v in s.values())
    assert id(parked["master"]["linear.weight"]) in hosts
    _, other = _opt(seed=5)
    other.offload()
    other.load_state(parked)  # onloads first: the loaded values go into the device tensors
    assert not other.offloaded
    for n in resident["master"]:
        assert torch.equal(other.master[n].detach(), resident["master"][n])


def test_a_view_is_refused():
    base = torch.zeros(8)
    with pytest.raises(ValueError, match="top-rl: cannot offload a tensor of shape \\(4,\\) that is a view"):
        HostCopies().offload([base[:4]])


def _gpu_adamw_on_cpu():
    """GpuAdamW around a stand-in for Megatron's DDP (it cannot run on CPU): one flat fp32 gradient buffer whose
    views are each parameter's main_grad, as _ParamAndGradBuffer lays them out."""
    params = _model()
    sizes = {n: p.numel() for n, p in params.items()}
    flat = torch.zeros(sum(sizes.values()))
    views, at = {}, 0
    for n, p in params.items():
        views[n] = flat[at: at + sizes[n]].view(p.shape)
        at += sizes[n]
    expert = torch.zeros(6)
    ddp = SimpleNamespace(buffers=[SimpleNamespace(grad_data=flat, param_data=None)],
                          expert_parallel_buffers=[SimpleNamespace(grad_data=expert, param_data=None)],
                          zero_grad_buffer=lambda: (flat.zero_(), expert.zero_()))
    opt = object.__new__(GpuAdamW)
    opt.ddp, opt.released_grads = ddp, []
    opt.fused = FusedMasterAdamW(list(params.items()), views, _cfg(), ONE_RANK)
    return opt, flat, expert, views


def test_gpu_adamw_frees_ddps_gradient_buffers_and_restores_them_zeroed():
    opt, flat, expert, views = _gpu_adamw_on_cpu()
    _fill(opt.fused, _grads(dict(opt.fused.named), 1.0))
    opt.fused.step()
    opt.zero_grad()
    nbytes = flat.untyped_storage().nbytes()
    flat.fill_(7.0)  # what a buffer holds while parked is not kept: it is zero between steps
    opt.offload()
    assert opt.offloaded and opt.fused.offloaded
    assert flat.untyped_storage().nbytes() == 0 and expert.untyped_storage().nbytes() == 0
    assert all(v.untyped_storage().nbytes() == 0 for v in views.values())  # main_grad views share the storage
    opt.offload()  # idempotent
    for call, what in ((opt.zero_grad, "zeroing the gradients"), (opt.local_grads, "reading the gradients")):
        with pytest.raises(RuntimeError, match=f"top-rl: {what} .*offloaded"):
            call()
    with pytest.raises(RuntimeError, match="top-rl: an optimizer step .*offloaded"):
        opt.step()
    opt.onload()
    assert not opt.offloaded and flat.untyped_storage().nbytes() == nbytes
    assert all(opt.fused.grads[n] is v for n, v in views.items())
    assert all(torch.equal(v, torch.zeros_like(v)) for v in views.values()) and not expert.any()
    _fill(opt.fused, _grads(dict(opt.fused.named), 1.0, seed=3))  # the views write into the restored buffer
    assert flat.abs().sum() > 0


def test_a_buffer_whose_weights_share_its_gradient_storage_is_refused():
    opt, flat, _, _ = _gpu_adamw_on_cpu()
    opt.ddp.buffers[0].param_data = flat.view(torch.bfloat16)
    with pytest.raises(ValueError, match="top-rl: this DDP buffer's weights share its gradient storage"):
        opt.offload()


def test_host_copies_are_packed_into_chunks_and_a_large_tensor_gets_its_own(monkeypatch):
    from top_rl.train import offload

    monkeypatch.setattr(offload, "HOST_CHUNK_BYTES", 4096)
    small = [torch.randn(100) for _ in range(20)]  # 400 B each: 8 to a 4 KiB chunk (512 B aligned)
    large = torch.randn(2000)  # 8000 B: its own
    mixed = [torch.randn(3).to(torch.bfloat16), torch.arange(5)]
    want = [t.clone() for t in [*small, large, *mixed]]
    host = HostCopies()
    host.offload([*small, large, *mixed])
    copies = [h for _, h, _ in host.parked]
    # 20 small in 3 chunks, the large one alone, the two after it in a fifth
    assert len({h.untyped_storage().data_ptr() for h in copies}) == 5
    assert copies[-3].untyped_storage().nbytes() == 8000
    for h, w in zip(copies, want):
        assert torch.equal(h, w) and h.dtype == w.dtype
    host.onload()
    for t, w in zip([*small, large, *mixed], want):
        assert torch.equal(t, w)
    again = list(host._host.values())
    host.offload([*small, large, *mixed])  # the copies are reused, not allocated again
    assert all(a is b for (_, a, _), (_, b) in zip(host.parked, again, strict=True))
