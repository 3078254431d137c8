"""The `sglang` backend's token log-probs on CPU: the dispatch between the gather kernel
(top_rl/kernels/sglang/logprob_triton.py) and lsm_BI + gather (CUDA only, the switch, one warning after a failed
launch), and the kernel under Triton's CPU interpreter against SGLang's own lsm_BI run in the interpreter too, so
both are the same kind of program: bit patterns equal for odd widths, ids at 0 and V-1, -inf entries. (The
interpreter rounds fp32 -> bf16 by truncation on both sides; the GPU's rounding: tests/gpu/test_logprob_gather.py.)"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest
import torch

from tests.helpers import with_plan

from top_rl.kernels.sglang import backend as sg
from top_rl.kernels.sglang import fused_forward as ff

_BITS = {torch.float32: torch.int32, torch.bfloat16: torch.int16}


def _torch_gather(z, ids):
    return torch.log_softmax(z.float(), -1).to(z.dtype).gather(-1, ids.unsqueeze(-1)).squeeze(-1)


class _Calls:
    """Stand-ins for the gather kernel (its launch fails here, or reports it ran) and for lsm_BI + gather (which
    needs a GPU): each records its calls and returns torch's log-softmax gathered."""

    def __init__(self, error=None):
        self.error, self.calls = error, []

    def gathered_log_softmax(self, z, ids):
        self.calls.append(("kernel", z.dtype))
        if self.error:
            raise self.error
        return _torch_gather(z, ids)

    def gathered_sampler_log_softmax(self, logits, temperature, ids):
        self.calls.append(("sampler_kernel", logits.dtype))
        if self.error:
            raise self.error
        z = (logits.float() / temperature.reshape(-1, 1)).to(logits.dtype)
        return _torch_gather(z, ids), torch.logsumexp(z.float(), -1)

    def eager(self, z, ids, log_softmax=None):
        self.calls.append(("eager", z.dtype))
        return _torch_gather(z, ids)


@pytest.fixture
def calls(monkeypatch):
    c = _Calls()
    monkeypatch.setattr(ff, "_gather_kernel", lambda: c)
    monkeypatch.setattr(ff, "token_logprobs_eager", c.eager)
    monkeypatch.setattr(ff, "_failed", {})
    with_plan(monkeypatch, fused_forward=True, fused_sampler=True)
    return c


def _logits(rows=4, vocab=50, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(0)
    return (torch.randn(rows, vocab, generator=g) * 4).to(dtype), torch.randint(0, vocab, (rows,), generator=g)


def _as_cuda(monkeypatch):
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))


def test_cpu_tensors_take_lsm_bi_and_gather(calls):
    logits, ids = _logits()
    sg.prefill_logprobs(logits, ids)
    assert calls.calls == [("eager", torch.float32)]


def test_cuda_takes_the_kernel_on_both_paths_with_lsm_bis_input_dtype(monkeypatch, calls):
    logits, ids = _logits()
    _as_cuda(monkeypatch)
    lp = sg.prefill_logprobs(logits, ids)  # prefill: fp32 of the logits; sampler: tempered, in the logits' dtype
    lt = sg.sample_logprobs(logits, ids, 0.7)
    assert calls.calls == [("kernel", torch.float32), ("sampler_kernel", torch.bfloat16)]
    assert (lp.dtype, lt.dtype) == (torch.float32, torch.bfloat16)
    with_plan(monkeypatch, fused_sampler=False)  # the sampler path's eager rounding, then the gather kernel
    sg.sample_logprobs(logits, ids, 0.7)
    assert calls.calls[-1] == ("kernel", torch.bfloat16)
    with_plan(monkeypatch, fused_forward=False)
    sg.prefill_logprobs(logits, ids)
    sg.sample_logprobs(logits, ids, 0.7)
    assert calls.calls[-2:] == [("eager", torch.float32), ("eager", torch.bfloat16)]


def test_sampler_kernel_takes_only_what_lsm_bi_would_load_alike(monkeypatch, calls):
    """The fused sampler pass needs loads like lsm_BI's of a fresh bf16 tensor: 2-D, contiguous, 16-byte aligned."""
    logits, ids = _logits(rows=4, vocab=64)
    _as_cuda(monkeypatch)
    sg.sample_logprobs(logits[:, :50], ids.clamp_max(49), 1.0)  # a column slice: not contiguous
    sg.sample_logprobs(logits.reshape(-1)[1:].reshape(-1)[:3 * 64].reshape(3, 64), ids[:3], 1.0)  # offset by 2 bytes
    sg.sample_logprobs(logits.float(), ids, 1.0)  # fp32 logits (an fp32 model)
    assert [c[0] for c in calls.calls] == ["kernel", "kernel", "kernel"]  # each: eager rounding, then the gather
    sg.sample_logprobs(logits, ids, 1.0)
    assert calls.calls[-1][0] == "sampler_kernel"


def test_inputs_the_kernel_does_not_take_go_to_lsm_bi(monkeypatch, calls):
    logits, ids = _logits()
    _as_cuda(monkeypatch)
    sg.sample_logprobs(logits.half(), ids, 1.0)  # fp16 logits
    ff.token_logprobs(logits.float(), ids.int(), None)  # int32 ids (gather itself refuses them)
    ff.token_logprobs(logits.float()[:0], ids[:0], None)  # no rows
    assert [c[0] for c in calls.calls] == ["eager"] * 3


def test_launch_failure_warns_once_then_lsm_bi(monkeypatch, calls):
    calls.error = RuntimeError("triton: PTX assembly failed")
    logits, ids = _logits()
    _as_cuda(monkeypatch)
    with pytest.warns(RuntimeWarning, match="fused token_logprobs forward failed.*PTX assembly failed"):
        first = sg.prefill_logprobs(logits, ids)
    second = sg.prefill_logprobs(logits, ids)
    assert torch.equal(first, second) and torch.equal(first, _torch_gather(logits.float(), ids))
    assert [c[0] for c in calls.calls] == ["kernel", "eager", "eager"]  # not retried
    assert "token_logprobs" in ff._failed


def test_out_of_memory_is_raised(monkeypatch, calls):
    calls.error = torch.OutOfMemoryError("CUDA out of memory")
    _as_cuda(monkeypatch)
    with pytest.raises(torch.OutOfMemoryError):
        sg.prefill_logprobs(*_logits())
    assert not ff._failed


# ----------------------------------------------------------------------------- Triton's CPU interpreter
@pytest.fixture(scope="module")
def interpreted(tmp_path_factory):
    """The results of tests/logprob_gather_interpreted.py: the kernel and SGLang's lsm_BI + gather, both run by
    Triton's CPU interpreter in a fresh process (one run for the whole module, a few seconds)."""
    pytest.importorskip("triton")
    path = tmp_path_factory.mktemp("interp") / "results.pt"
    root = pathlib.Path(__file__).resolve().parents[2]
    env = {**os.environ, "TRITON_INTERPRET": "1",
           "PYTHONPATH": os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH")) if p)}
    run = subprocess.run([sys.executable, str(root / "tests/logprob_gather_interpreted.py"), str(path)], env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    return torch.load(path)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("vocab", [7, 1024, 2500])  # under one block, exactly one, a masked third block
def test_interpreted_kernel_equals_interpreted_lsm_bi_gather(interpreted, vocab, dtype):
    got, want = interpreted[(str(dtype), vocab)]
    assert got.dtype == want.dtype == dtype
    assert torch.equal(got.view(_BITS[dtype]), want.view(_BITS[dtype])), (got, want)
    assert got[5] == float("-inf")  # the id's own logit is -inf
    assert torch.isfinite(got[:5]).all()


@pytest.mark.parametrize("vocab", [7, 1024, 2500])
def test_interpreted_sampler_kernel_and_its_backward_against_fp64(interpreted, vocab):
    """The sampler pass (division, rounding, the two row reductions, the gathered id, the kept shift) and its
    one-pass backward, run by the interpreter at power-of-two temperatures (L / T exact, so the interpreter's
    truncating bf16 rounding cannot differ from the GPU's): against log_softmax and its gradient in fp64."""
    logits, temps, ids, g, out, shift, grad = interpreted[("sampler", vocab)]
    z = (logits.double() / temps.double()[:, None])
    ref = torch.log_softmax(z, -1).gather(-1, ids[:, None])[:, 0]
    assert out.dtype == torch.bfloat16 and shift.dtype == torch.float32
    torch.testing.assert_close(out.double(), ref, rtol=2 ** -7, atol=1e-6)
    torch.testing.assert_close(shift.double(), torch.logsumexp(z, -1), rtol=1e-6, atol=1e-5)
    want = (torch.nn.functional.one_hot(ids, vocab).double() - torch.softmax(z, -1)) * (g.double() / temps.double())[:, None]
    assert grad.dtype == torch.bfloat16
    torch.testing.assert_close(grad.double(), want, rtol=2 ** -7, atol=1e-6)


def test_interpreted_kernel_keeps_leading_dims_and_marks_bad_ids_nan(interpreted):
    got_3d, got_2d = interpreted["3d"]
    assert got_3d.shape == (2, 3) and torch.equal(got_3d.flatten(), got_2d)
    assert torch.isnan(interpreted["bad_ids"]).all()
    assert "ids shape (3,) must be the logits' leading shape (6,)" in interpreted["shape_error"]
