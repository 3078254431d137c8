"""The `sglang` backend's fused backwards (top_rl/kernels/sglang/backward.py) on CPU: their formulas against
autograd in fp64, and the fall back to the eager formula when torch.compile fails. The compiled kernels
themselves run in tests/gpu/test_grads.py (every sglang-backend backward against an fp64 reference)."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import interpreted_module, with_plan
from top_rl.kernels import reference as R
from top_rl.kernels.sglang import backward as sb


@pytest.mark.parametrize("temperature", [None, 0.7])
@pytest.mark.parametrize("formula", [sb._token_logprobs_grad_onehot, sb._token_logprobs_grad_scatter])
def test_token_logprobs_grad(formula, temperature):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 50, generator=g, dtype=torch.float64) * 3
    ids = torch.randint(0, 50, (6,), generator=g)
    go = torch.randn(6, generator=g, dtype=torch.float64)
    t = None if temperature is None else torch.full((6, 1), temperature, dtype=torch.float64)
    leaf = logits.clone().requires_grad_()
    z = leaf if t is None else leaf / t
    torch.log_softmax(z, -1).gather(-1, ids[:, None])[:, 0].backward(go)
    got = formula(logits if t is None else logits / t, ids, t, go)  # the formulas take z = bf(L / T), rounded
    assert got.dtype == logits.dtype
    torch.testing.assert_close(got, leaf.grad, rtol=1e-12, atol=1e-12)


def test_sampler_input_is_rounded_before_the_gradient_kernel(monkeypatch):
    """token_logprobs_grad hands the kernel bf(L / T) already rounded: the compiled kernel cannot drop it."""
    seen = []
    monkeypatch.setattr(sb, "_run", lambda name, fn, z, *a, **k: seen.append(z))
    logits = (torch.randn(3, 40) * 3).bfloat16()
    t = torch.full((3, 1), 0.7)
    sb.token_logprobs_grad(logits, torch.zeros(3, dtype=torch.long), t, torch.ones(3))
    assert seen[0].dtype == torch.bfloat16 and torch.equal(seen[0], logits.div(t).bfloat16())


def test_compile_failure_falls_back_to_eager_once(monkeypatch):
    calls = []

    def broken_compile(fn, dynamic):
        def run(*args):
            calls.append("compiled")
            raise RuntimeError("inductor: no C++ compiler")
        return run

    monkeypatch.setattr(sb, "_compiled", {})
    monkeypatch.setattr(sb, "_failed", {})
    monkeypatch.setattr(sb.torch, "compile", broken_compile)
    x = torch.randn(4, 2, 8)
    cos, sin = torch.randn(4, 1, 4), torch.randn(4, 1, 4)
    with pytest.warns(RuntimeWarning, match="rope backward failed.*no C\\+\\+ compiler"):
        first = sb.rope_grad(x, cos, sin)
    second = sb.rope_grad(x, cos, sin)
    assert calls == ["compiled"]  # not retried
    from top_rl.kernels.reference import rope_grad

    assert torch.equal(first, rope_grad(x, cos, sin)) and torch.equal(second, first)
    assert "rope" in sb._failed


def test_out_of_memory_is_not_swallowed(monkeypatch):
    def oom_compile(fn, dynamic):
        def run(*args):
            raise torch.OutOfMemoryError("CUDA out of memory")
        return run

    monkeypatch.setattr(sb, "_compiled", {})
    monkeypatch.setattr(sb, "_failed", {})
    monkeypatch.setattr(sb.torch, "compile", oom_compile)
    with pytest.raises(torch.OutOfMemoryError):
        sb.silu_and_mul_grad(torch.randn(3, 8), torch.randn(3, 4))
    assert not sb._failed


def test_env_switch_runs_the_eager_formula(monkeypatch):
    with_plan(monkeypatch, fused_backward=False)
    monkeypatch.setattr(sb.torch, "compile", lambda fn, dynamic: pytest.fail("compiled despite the switch"))
    g, go = torch.randn(3, 8), torch.randn(3, 4)
    from top_rl.kernels.reference import silu_and_mul_grad

    assert torch.equal(sb.silu_and_mul_grad(g, go), silu_and_mul_grad(g, go))


@pytest.fixture
def interpreted_swiglu_grad(monkeypatch):
    path = sb.__file__.replace("backward.py", "swiglu_grad_triton.py")
    with interpreted_module(monkeypatch, path, "_top_rl_swiglu_grad_interpreted") as mod:
        yield mod


@pytest.mark.parametrize("shape", [(5, 2 * 1100), (2, 3, 2 * 64)])  # a masked second block; 3-D rows
def test_interpreted_swiglu_grad_equals_the_formula(interpreted_swiglu_grad, shape):
    """The Triton SiLU-and-mul backward's indexing (both halves, rows, a masked block) and formula, in fp32, against
    the reference formula; gates wide enough to saturate the sigmoid at both ends."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(shape, generator=g) * 8
    go = torch.randn(*shape[:-1], shape[-1] // 2, generator=g)
    got = interpreted_swiglu_grad.silu_and_mul_grad(x, go)
    assert got.shape == x.shape and got.dtype == x.dtype
    torch.testing.assert_close(got, R.silu_and_mul_grad(x, go), rtol=1e-5, atol=1e-6)
