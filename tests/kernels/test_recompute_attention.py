"""top.fast_paths.recompute_attention on CPU: the checkpointed layer's first pass runs the engine's attention kernel
(its output is what the loss and the gate see), the recompute inside the backward runs FlashAttention-2's forward and
hands that forward's output and LSE to the flash backward; both passes save tensors of the same shapes, which
torch's non-reentrant checkpoint requires. The GPU kernels (SGLang's Triton extend kernel, aten's flash forward and
backward) do not run on a CPU, so stand-ins take their places here, each recording its calls: what is checked is the
plumbing around them. tests/gpu runs the real kernels."""

from __future__ import annotations

import torch

from tests.helpers import with_plan
from top_rl import kernels
from top_rl.kernels import checkpoint_pass
from top_rl.kernels.sglang import attention as attn
from top_rl.kernels.sglang import attention_backward as bw
from top_rl.train import recompute


def _causal(q, k, v, cu, scale):
    """Plain causal attention per packed sequence (fp32 math): the stand-ins' output, and their LSE [Hq, T]."""
    group = q.shape[1] // k.shape[1]
    outs, lses = [], []
    for a, b in zip(cu[:-1].tolist(), cu[1:].tolist()):
        qs, ks, vs = (t[a:b].float().transpose(0, 1) for t in (q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)))
        s = qs @ ks.transpose(1, 2) * scale
        s = s.masked_fill(torch.ones(b - a, b - a, dtype=torch.bool).triu(1), float("-inf"))
        outs.append((s.softmax(-1) @ vs).transpose(0, 1))
        lses.append(s.logsumexp(-1))
    return torch.cat(outs).to(q.dtype), torch.cat(lses, dim=1)


def _stand_ins(monkeypatch):
    calls = {"engine": [], "flash": [], "backward": []}

    def engine(q, k, v, batch, scale, want_lse):
        calls["engine"].append(checkpoint_pass.current())
        out, _ = _causal(q, k, v, batch.cu(torch.int64), scale)
        return out + 0.0078125, None  # a bf16 step apart from flash's: which kernel's output went where is visible

    def flash(q, k, v, batch, scale):
        calls["flash"].append(checkpoint_pass.current())
        return _causal(q, k, v, batch.cu(torch.int64), scale)

    def backward(g, q, k, v, cu_seqlens, max_len, scale, out=None, lse=None):
        calls["backward"].append((out, lse))
        with torch.enable_grad():
            qq, kk, vv = (t.detach().float().requires_grad_() for t in (q, k, v))
            ref, _ = _causal(qq, kk, vv, cu_seqlens, scale)
            return torch.autograd.grad(ref, (qq, kk, vv), g.float())

    monkeypatch.setitem(attn._PREFILL, "triton", engine)
    monkeypatch.setattr(attn, "flash_forward", flash)
    monkeypatch.setattr(bw, "attention_backward", backward)
    return calls


def _layer_loss(q, k, v, cu, checkpointed: bool):
    def layer(q, k, v):
        return attn.attention(q, k, v, cu, 0.125) * 2.0
    out = recompute.non_reentrant_checkpoint(layer, False, q, k, v) if checkpointed else layer(q, k, v)
    return out, out.float().square().sum()


def _inputs():
    g = torch.Generator().manual_seed(0)
    cu = torch.tensor([0, 5, 12, 16])
    q = torch.randn(16, 4, 8, generator=g).bfloat16().requires_grad_()
    k = torch.randn(16, 2, 8, generator=g).bfloat16().requires_grad_()
    v = torch.randn(16, 2, 8, generator=g).bfloat16().requires_grad_()
    return q, k, v, cu


def test_the_recompute_runs_flash_and_hands_its_lse_to_the_backward_while_the_gated_output_is_the_engines(monkeypatch):
    with_plan(monkeypatch, attention="triton", recompute_attention=True)
    calls = _stand_ins(monkeypatch)
    q, k, v, cu = _inputs()
    out, loss = _layer_loss(q, k, v, cu, checkpointed=True)
    engine_out, _ = _causal(q.detach(), k.detach(), v.detach(), cu, 0.125)
    assert torch.equal(out, (engine_out + 0.0078125) * 2.0)  # the first pass: the engine's kernel
    assert calls == {"engine": [checkpoint_pass.FIRST], "flash": [], "backward": []}
    loss.backward()  # torch's checkpoint raises if the two passes saved tensors of other shapes
    assert calls["engine"] == [checkpoint_pass.FIRST] and calls["flash"] == [checkpoint_pass.RECOMPUTE]
    (got_out, got_lse), = calls["backward"]
    flash_out, flash_lse = _causal(q.detach(), k.detach(), v.detach(), cu, 0.125)
    assert torch.equal(got_out, flash_out) and torch.equal(got_lse, flash_lse)  # the recompute's, not the placeholder
    assert q.grad is not None and k.grad.shape == k.shape and v.grad.shape == v.shape
    assert kernels.report()["paths"]["attention_recompute"] == "flash_varlen"  # in run_dir/kernels.json


def test_off_by_default_and_outside_a_checkpoint_every_pass_runs_the_engines_kernel(monkeypatch):
    with_plan(monkeypatch, attention="triton")  # recompute_attention: the default
    calls = _stand_ins(monkeypatch)
    _, loss = _layer_loss(*_inputs(), checkpointed=True)
    loss.backward()
    assert calls["engine"] == [checkpoint_pass.FIRST, checkpoint_pass.RECOMPUTE] and calls["flash"] == []
    assert calls["backward"] == [(None, None)]  # the backward re-runs its own forward for the LSE, as before

    with_plan(monkeypatch, attention="triton", recompute_attention=True)
    calls = _stand_ins(monkeypatch)
    _, loss = _layer_loss(*_inputs(), checkpointed=False)  # recompute off: no pass, the switch changes nothing
    loss.backward()
    assert calls["engine"] == [None] and calls["flash"] == [] and calls["backward"] == [(None, None)]


def test_a_checkpointed_function_sees_its_first_pass_then_the_recompute():
    seen = []

    def fn(x):
        seen.append(checkpoint_pass.current())
        return x.exp()
    x = torch.ones(3, requires_grad=True)
    assert checkpoint_pass.current() is None
    recompute.non_reentrant_checkpoint(fn, False, x).sum().backward()
    assert seen == [checkpoint_pass.FIRST, checkpoint_pass.RECOMPUTE] and checkpoint_pass.current() is None
    assert torch.equal(x.grad, x.detach().exp())
