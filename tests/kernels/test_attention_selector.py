"""CPU checks of the GPU attention module's selection and flashinfer plumbing (flashinfer absent or mocked).

What runs the real kernels is tests/gpu; here: the backend must be chosen explicitly and be one the TOP
contract allows, the flashinfer path shares one 1 GiB fa2 workspace, plans once per batch with the
engine's deterministic-mode arguments, and fails with a clear message when flashinfer is missing.
"""

import os
import pathlib
import subprocess
import sys
import types

import pytest
import torch

from tests.helpers import with_plan
from top_rl import contract
from top_rl.kernels import packed_batch as pb
from top_rl.kernels import plan as kplan
from top_rl.kernels.sglang import attention as attn
from top_rl.kernels.sglang import attention_backward as bw
from top_rl.kernels.sglang import attention_flashinfer as fi


@pytest.fixture(autouse=True)
def clean(monkeypatch):
    monkeypatch.setattr(kplan, "_installed", kplan.build(environ={}))  # no attention kernel chosen, all fast paths on
    attn.FlashinferState.reset()
    yield
    attn.FlashinferState.reset()


def test_backend_must_be_chosen(monkeypatch):
    with pytest.raises(RuntimeError, match="--attention-backend"):
        attn.attention_backend()
    kplan.set_current(kplan.build(environ={kplan.ATTENTION_ENV: "triton"}))  # a bench's env, read by the builder
    assert attn.attention_backend() == "triton"
    kplan.set_current(kplan.build(attention="flashinfer", environ={kplan.ATTENTION_ENV: "triton"}))  # the run's wins
    assert attn.attention_backend() == "flashinfer"


def test_backend_outside_contract_refused(monkeypatch):
    with pytest.raises(ValueError, match="contract"):
        attn.set_attention_backend("torch_native")
    with pytest.raises(ValueError, match="contract"):
        kplan.build(environ={kplan.ATTENTION_ENV: "trtllm_mha"})
    assert set(attn.BACKENDS) == {"fa3", "flashinfer", "triton"}
    for top in contract.CONTRACTS.values():  # every backend a contract allows has its kernels here
        assert set(top.attention_backends) <= set(attn.BACKENDS), top.name


def test_token_indices():
    lengths = torch.tensor([3, 0, 2])
    assert fi.token_indices(lengths, 5).tolist() == [0, 1, 2, 10, 11]


def test_decode_kv_indices_built_on_the_device_begin_with_the_host_ones():
    """The decode kernel reads entries [0, kv_indptr[b]) of kv_indices: those must be _token_indices', whatever the
    lengths (zeros, a full row, the last row empty); the rest of the fixed b * max_len is never read."""
    g = torch.Generator().manual_seed(0)
    for lengths in ([3, 0, 2], [5, 5, 5], [1, 4, 0], [0, 0, 1], *(torch.randint(0, 9, (6,), generator=g).tolist()
                                                                  for _ in range(20))):
        lengths = torch.tensor(lengths)
        max_len = max(int(lengths.max()), 1) + 2
        indptr = torch.zeros(len(lengths) + 1, dtype=torch.int32)
        indptr[1:] = torch.cumsum(lengths, 0)
        got = attn.decode_kv_indices(indptr, len(lengths), max_len)
        assert got.shape == (len(lengths) * max_len,) and got.dtype == torch.int64
        assert torch.equal(got[: int(lengths.sum())], fi.token_indices(lengths, max_len))


class _Wrapper:
    def __init__(self, kind, workspace, layout, **kw):
        self.kind, self.workspace, self.layout, self.kw = kind, workspace, layout, kw
        self.plans, self.runs = [], []

    def begin_forward(self, *args, **kw):
        self.plans.append((args, kw))

    def forward(self, q, *args, **kw):
        if self.kind != "ragged_prefill":
            _check_paged_kv(args[0])
        self.runs.append((args, kw))
        return torch.zeros_like(q)

    def forward_return_lse(self, q, *args, **kw):  # flashinfer: the same call, plus the base-2 LSE [T, Hq]
        self.lse_runs = getattr(self, "lse_runs", 0) + 1
        return self.forward(q, *args, **kw), torch.full(q.shape[:2], 2.0)


def _check_paged_kv(kv):
    """What flashinfer 0.6.7.post3 does with a (K, V) tuple before its paged kernels run: 3-D buffers get a
    page dim (utils._expand_4d, NHD), then batch_prefill.cu / batch_decode.cu refuse K and V whose strides
    differ (they read both through K's strides)."""
    k, v = (t.unsqueeze(-3) if t.dim() == 3 else t for t in kv)
    assert k.dim() == v.dim() == 4
    for i in range(4):
        if k.stride(i) != v.stride(i):
            raise RuntimeError(f"Check failed: paged_k_cache.stride(i) == paged_v_cache.stride(i) "
                               f"({k.stride(i)} vs. {v.stride(i)})")


def _fake_flashinfer():
    fi = types.ModuleType("flashinfer")
    fi.BatchPrefillWithPagedKVCacheWrapper = lambda ws, layout, **kw: _Wrapper("paged_prefill", ws, layout, **kw)
    fi.BatchPrefillWithRaggedKVCacheWrapper = lambda ws, layout, **kw: _Wrapper("ragged_prefill", ws, layout, **kw)
    fi.BatchDecodeWithPagedKVCacheWrapper = lambda ws, layout, **kw: _Wrapper("decode", ws, layout, **kw)
    return fi


@pytest.fixture
def fake_fi(monkeypatch):
    monkeypatch.setitem(sys.modules, "flashinfer", _fake_flashinfer())
    monkeypatch.setattr(fi, "FLASHINFER_WORKSPACE_BYTES", 4096)  # keep the CPU test small
    attn.set_attention_backend("flashinfer")


def _qkv(cu, hq=4, hkv=2, d=8):
    t = cu[-1]
    return torch.randn(t, hq, d), torch.randn(t, hkv, d), torch.randn(t, hkv, d), torch.tensor(cu)


def test_flashinfer_absent_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "flashinfer", None)  # import raises ImportError
    attn.set_attention_backend("flashinfer")
    q, k, v, cu = _qkv([0, 3, 5])
    with pytest.raises(RuntimeError, match="flashinfer"):
        attn.attention(q, k, v, cu, 0.5)


def test_flashinfer_one_shared_fa2_workspace(fake_fi):
    assert attn.FlashinferState.__dict__["_instance"] is None
    s = attn.FlashinferState.get("cpu")
    assert attn.FlashinferState.get("cpu") is s  # a process-wide singleton
    assert s.prefill.workspace is s.workspace and s.decode.workspace is s.workspace
    assert s.workspace.dtype == torch.uint8 and s.workspace.numel() == 4096
    assert s.prefill.kind == "paged_prefill" and s.prefill.kw == {"backend": "fa2"}
    assert s.decode.kw == {"use_tensor_cores": True, "backend": "fa2"}
    assert s.prefill.layout == s.decode.layout == "NHD"


def test_workspace_default_is_one_gib():
    assert fi.FLASHINFER_WORKSPACE_BYTES == 1 << 30


def test_flashinfer_prefill_plans_once_per_batch(fake_fi):
    q, k, v, cu = _qkv([0, 3, 5, 9])
    for _layer in range(28):
        out = attn.attention(q, k, v, cu, 0.25)
    s = attn.FlashinferState.get("cpu")
    assert out.shape == q.shape
    assert s.plan_count["prefill"] == 1 and len(s.prefill.plans) == 1 and len(s.prefill.runs) == 28
    args, kw = s.prefill.plans[0]
    qo, kv_indptr, indices, last, hq, hkv, d, page = args
    assert qo.tolist() == kv_indptr.tolist() == [0, 3, 5, 9]
    assert indices.tolist() == list(range(9)) and last.tolist() == [1, 1, 1] and page == 1
    assert (hq, hkv, d) == (4, 2, 8)
    assert kw["fixed_split_size"] == 4096 and kw["q_data_type"] == torch.float32
    run_args, run_kw = s.prefill.runs[0]
    k_buf, v_buf = run_args[0]
    assert k_buf.shape == (9, 2, 8) and v_buf.shape == (9, 2, 8)  # the engine's [tokens, Hkv, d] KV buffers
    assert k_buf.is_contiguous() and v_buf.is_contiguous()
    assert run_kw["causal"] is True and run_kw["sm_scale"] == 0.25
    q2, k2, v2, cu2 = _qkv([0, 4, 9])  # another batch: a new plan
    attn.attention(q2, k2, v2, cu2, 0.25)
    assert s.plan_count["prefill"] == 2


def test_flashinfer_ragged_prefill_is_fa2(fake_fi, monkeypatch):
    monkeypatch.setattr(fi, "FLASHINFER_PREFILL", "ragged")
    q, k, v, cu = _qkv([0, 2, 7])
    attn.attention(q, k, v, cu, 0.5)
    attn.attention(q, k, v, cu, 0.5)
    s = attn.FlashinferState.get("cpu")
    assert s.prefill.kind == "ragged_prefill" and s.prefill.kw == {"backend": "fa2"}
    assert len(s.prefill.plans) == 1
    args, kw = s.prefill.plans[0]
    assert args[0].tolist() == args[1].tolist() == [0, 2, 7] and kw["fixed_split_size"] == 4096
    assert s.prefill.runs[0][1]["causal"] is True


def test_decode_reads_its_lengths_once_per_forward(fake_fi, monkeypatch):
    """Every layer of a decode forward gets the same lengths tensor: flashinfer's plan key reads it to the host once
    (not once per layer), again only for another tensor or after an in-place change."""
    reads = []
    tolist = torch.Tensor.tolist
    monkeypatch.setattr(torch.Tensor, "tolist", lambda t: reads.append(1) or tolist(t))
    b, max_len, hq, hkv, d = 3, 6, 4, 2, 8
    q, kc, vc = torch.randn(b, hq, d), torch.randn(b, max_len, hkv, d), torch.randn(b, max_len, hkv, d)
    lengths = torch.tensor([1, 6, 4])
    for _layer in range(5):
        attn.decode_attention(q, kc, vc, lengths, 0.5)
    assert len(reads) == 1
    attn.decode_attention(q, kc, vc, lengths.clone(), 0.5)
    lengths.sub_(torch.tensor([0, 1, 0]))
    attn.decode_attention(q, kc, vc, lengths, 0.5)
    assert len(reads) == 3 and attn.FlashinferState.get("cpu").plan_count["decode"] == 2


def test_flashinfer_decode_plan(fake_fi):
    b, max_len, hq, hkv, d = 3, 6, 4, 2, 8
    q = torch.randn(b, hq, d)
    kc, vc = torch.randn(b, max_len, hkv, d), torch.randn(b, max_len, hkv, d)
    lengths = torch.tensor([1, 6, 4])
    for _layer in range(5):
        attn.decode_attention(q, kc, vc, lengths, 0.5)
    s = attn.FlashinferState.get("cpu")
    assert s.plan_count["decode"] == 1 and len(s.decode.runs) == 5
    (indptr, indices, last, n_hq, n_hkv, n_d, page), kw = s.decode.plans[0]
    assert indptr.tolist() == [0, 1, 7, 11]
    assert indices.tolist() == [0, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15]
    assert last.tolist() == [1, 1, 1] and page == 1 and (n_hq, n_hkv, n_d) == (hq, hkv, d)
    assert kw["fixed_split_size"] == 2048 and kw["disable_split_kv"] is False
    assert s.decode.runs[0][1]["sm_scale"] == 0.5
    attn.decode_attention(q, kc, vc, lengths + torch.tensor([0, 0, 1]), 0.5)  # next step: new plan
    assert s.plan_count["decode"] == 2


def test_flashinfer_kv_from_fused_qkv_has_equal_strides(fake_fi):
    """The model and the trainer take V as a column slice of the fused qkv projection (row stride = the qkv
    width) and K fresh from RoPE (row stride Hkv*d): flashinfer refused that pair on the H200 (1024 vs. 4096).
    Both sides must reach it as the engine's two contiguous KV buffers."""
    t, hq, hkv, d = 9, 4, 2, 8
    qkv = torch.randn(t, (hq + 2 * hkv) * d)
    q, k, v = qkv.split([hq * d, hkv * d, hkv * d], dim=-1)
    q, k, v = q.reshape(t, hq, d).contiguous(), k.reshape(t, hkv, d).contiguous(), v.reshape(t, hkv, d)
    assert v.stride(0) != k.stride(0)
    attn.attention(q, k, v, torch.tensor([0, 4, 9]), 0.5)
    b, max_len = 2, 5
    kc = torch.randn(b, max_len, hkv, d)
    vc = torch.randn(b, max_len, 2 * hkv, d)[:, :, :hkv]  # a non-contiguous cache view
    attn.decode_attention(torch.randn(b, hq, d), kc, vc, torch.tensor([2, 5]), 0.5)


def test_attention_backward_kernel_choice(monkeypatch):
    """Backward: FlashAttention-2 for bf16/fp16 (GQA native), memory-efficient otherwise, forced by the env var,
    and a flash call that raises falls back to memory-efficient for the rest of the process."""
    monkeypatch.setattr(bw, "_flash_backward_failed", [])
    assert bw.backward_kernel(torch.bfloat16) == "flash" and bw.backward_kernel(torch.float32) == "efficient"
    with_plan(monkeypatch, attention_backward="efficient")
    assert bw.backward_kernel(torch.bfloat16) == "efficient"
    with pytest.raises(ValueError, match="TOP_RL_ATTENTION_BACKWARD='fast'"):
        kplan.build(environ={"TOP_RL_ATTENTION_BACKWARD": "fast"})
    assert kplan.build(environ={"TOP_RL_ATTENTION_BACKWARD": "efficient"}).fast_paths.attention_backward == "efficient"
    with_plan(monkeypatch, attention_backward="flash")

    def no_flash(*a):
        raise RuntimeError("_flash_attention_forward: not available")

    monkeypatch.setattr(bw, "flash_attention_backward", no_flash)
    monkeypatch.setattr(bw, "efficient_attention_backward", lambda *a: "efficient")
    args = (None, torch.zeros(1, dtype=torch.bfloat16), None, None, None, 1, 1.0)
    with pytest.warns(RuntimeWarning, match="not available"):
        assert bw.attention_backward(*args) == "efficient"
    assert bw.backward_kernel(torch.bfloat16) == "efficient"  # no second attempt
    from top_rl import kernels

    assert "attention_backward" in kernels.report()["fallbacks"]  # counted in the run's kernels/fallbacks



def test_one_host_read_of_cu_seqlens_per_batch(fake_fi):
    """Every layer gets the same cu_seqlens; reading it on the host (max length, the plan key) syncs the device,
    so it is read once per tensor, not per layer: 28 layers, one read; a new batch or an in-place change, one more."""
    q, k, v, cu = _qkv([0, 3, 5, 9])
    cu = cu.to(torch.int32)  # the trainer's PackedSeqParams dtype
    before = pb.host_reads
    for _layer in range(28):
        attn.attention(q, k, v, cu, 0.25)
    assert pb.host_reads == before + 1
    assert attn.FlashinferState.get("cpu").plan_count["prefill"] == 1
    cu[2] = 4  # same tensor, new values: must be read again (and planned again)
    attn.attention(q, k, v, cu, 0.25)
    assert pb.host_reads == before + 2 and attn.FlashinferState.get("cpu").plan_count["prefill"] == 2
    attn.attention(q, k, v, cu.clone(), 0.25)
    assert pb.host_reads == before + 3


def test_packed_batch_views():
    cu = torch.tensor([0, 3, 3, 10], dtype=torch.int32)
    b = pb.packed_batch(cu)
    assert b.bounds == (0, 3, 3, 10) and b.lengths == (3, 0, 7) and b.max_len == 7 and b.num_tokens == 10
    assert b.cu(torch.int32) is cu  # no copy of a tensor that already has the dtype
    c64 = b.cu(torch.int64)
    assert c64.dtype == torch.int64 and c64.tolist() == cu.tolist() and b.cu(torch.int64) is c64
    built = []
    assert b.derived("x", lambda: built.append(1) or torch.ones(1)) is b.derived("x", lambda: built.append(1))
    assert built == [1]
    assert pb.packed_batch(torch.tensor([0], dtype=torch.int32)).max_len == 0
    with torch.inference_mode():  # no version counter: never cached, so an in-place write is seen
        inf = torch.tensor([0, 2, 5])
        assert pb.packed_batch(inf).max_len == 3
        inf[2] = 9
        assert pb.packed_batch(inf).bounds == (0, 2, 9)


def test_forward_lse_kept_only_for_a_flash_backward_of_flashinfer(fake_fi, monkeypatch):
    """flashinfer's forward returns the LSE the flash backward needs (so backward need not re-run a forward):
    asked for only when a gradient will be taken, in bf16/fp16 (flash backward), and not when switched off."""
    q, k, v, cu = _qkv([0, 3, 5])
    q, k, v = q.bfloat16(), k.bfloat16(), v.bfloat16()
    s = attn.FlashinferState.get("cpu")
    attn.attention(q, k, v, cu, 0.5)  # no grad wanted
    assert getattr(s.prefill, "lse_runs", 0) == 0
    attn.attention(q.requires_grad_(), k, v, cu, 0.5)
    assert s.prefill.lse_runs == 1
    with_plan(monkeypatch, flashinfer_lse=False)
    attn.attention(q, k, v, cu, 0.5)
    assert s.prefill.lse_runs == 1
    with_plan(monkeypatch, flashinfer_lse=True)
    attn.attention(q.float().detach().requires_grad_(), k.float(), v.float(), cu, 0.5)  # efficient backward
    assert s.prefill.lse_runs == 1


def test_fa3s_forward_lse_goes_to_the_flash_backward_unchanged_and_only_when_wanted(monkeypatch):
    """fa3's forward returns its LSE ([Hq, T] fp32, natural log: FlashAttention-2's varlen layout) when asked: asked
    only when a gradient will be taken, in bf16/fp16 (flash backward) and with top.fast_paths.fa3_lse on; then the
    backward gets that very tensor (no conversion), else it re-runs a forward for one. The kernel is a stand-in
    returning marked tensors; tests/gpu/test_fa3_trainer.py runs the real one."""
    asked, backward_state = [], []

    def fake_fa3(*, q, return_softmax_lse=False, **_):
        asked.append(return_softmax_lse)
        out = torch.zeros_like(q)
        lse = torch.arange(q.shape[1] * q.shape[0], dtype=torch.float32).reshape(q.shape[1], q.shape[0])
        return (out, lse, None, None) if return_softmax_lse else out

    def fake_backward(g, q, k, v, cu_seqlens, max_len, scale, *state):
        backward_state.append(state)
        return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)

    monkeypatch.setattr(attn, "_fa3", lambda: fake_fa3)
    monkeypatch.setattr(attn._backward, "attention_backward", fake_backward)
    with_plan(monkeypatch, attention="fa3")
    q, k, v, cu = _qkv([0, 3, 5])
    q, k, v = q.bfloat16(), k.bfloat16(), v.bfloat16()
    attn.attention(q, k, v, cu, 0.5)  # no gradient wanted
    attn.attention(q.requires_grad_(), k, v, cu, 0.5).float().sum().backward()
    assert asked == [False, True]
    (out, lse), = backward_state
    assert out.shape == q.shape and torch.equal(lse, torch.arange(4 * 5, dtype=torch.float32).reshape(4, 5))
    with_plan(monkeypatch, attention="fa3", fa3_lse=False)  # the switch off: the backward re-runs a forward
    attn.attention(q, k, v, cu, 0.5).float().sum().backward()
    with_plan(monkeypatch, attention="fa3", fa3_lse=True)
    attn.attention(q.float().detach().requires_grad_(), k.float(), v.float(), cu, 0.5).sum().backward()  # efficient
    assert asked == [False, True, False, False] and backward_state[1:] == [(), ()]


def test_lse_for_flash_is_natural_log_heads_first():
    lse2 = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])  # [T=2, Hq=3], base 2
    out = bw.lse_for_flash(lse2)
    assert out.shape == (3, 2) and out.is_contiguous() and out.dtype == torch.float32
    assert torch.allclose(out, lse2.t() * torch.log(torch.tensor(2.0)))


def test_triton_prefill_and_decode_through_the_seam_in_triton_interpreter(tmp_path):
    """SGLang's own triton extend kernel, run by Triton's CPU interpreter through `kernels.attention` with the
    trainer's int32 cu_seqlens: the arguments built from the PackedBatch (indptrs, kv indices, prefix lengths,
    max length) give causal per-sequence attention (fp64 reference), and three layers read cu_seqlens once. Its
    decode kernel through `kernels.decode_attention`: the same bits with device-built and host-built kv indices."""
    pytest.importorskip("triton")
    pytest.importorskip("sglang")
    root = pathlib.Path(__file__).resolve().parents[2]
    env = {**os.environ, "TRITON_INTERPRET": "1",
           "PYTHONPATH": os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH")) if p)}
    run = subprocess.run([sys.executable, str(root / "tests/attention_triton_interpreted.py"), str(tmp_path / "r.pt")],
                         env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    r = torch.load(tmp_path / "r.pt")
    assert r["host_reads"] == 1
    for out in r["outs"]:
        assert out.shape == r["reference"].shape
        torch.testing.assert_close(out.double(), r["reference"], rtol=0, atol=1e-5)
    # decode: kv indices built on the device give the host-built ones' bits, and attention over each row's prefix
    assert torch.equal(r["decode"], r["decode_host_indices"])
    torch.testing.assert_close(r["decode"].double(), r["decode_reference"], rtol=0, atol=1e-5)


def test_flash_backward_falling_back_mid_step_keeps_recompute_consistent(monkeypatch):
    """Under non-reentrant recompute each layer's forward runs twice and must save the same tensors both times.
    A flash backward failing in one layer (-> efficient kernels from then on) happens between the forward and the
    recompute of the layers before it: whether the forward keeps flashinfer's LSE must not depend on that."""
    import torch.utils.checkpoint as checkpoint

    monkeypatch.setattr(bw, "_flash_backward_failed", [])
    kept = []

    def fake_prefill(q, k, v, batch, scale, want_lse):  # a differentiable stand-in for flashinfer's forward
        kept.append(want_lse)
        return q * 1.0, (torch.zeros(q.shape[0], q.shape[1]) if want_lse else None)

    def no_flash(*a):
        raise RuntimeError("flash op missing in this build")

    monkeypatch.setitem(attn._PREFILL, "flashinfer", fake_prefill)
    monkeypatch.setattr(bw, "flash_attention_backward", no_flash)
    monkeypatch.setattr(bw, "efficient_attention_backward",
                        lambda g, q, k, v, *a: (g * 1.0, torch.zeros_like(k), torch.zeros_like(v)))
    attn.set_attention_backend("flashinfer")
    cu = torch.tensor([0, 3, 5], dtype=torch.int32)
    x = torch.randn(5, 4, 8, dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(5, 2, 8, dtype=torch.bfloat16)
    h = x
    for _layer in range(2):
        h = checkpoint.checkpoint(lambda a: attn.attention(a * 2, k, k, cu, 0.5), h, use_reentrant=False)
    with pytest.warns(RuntimeWarning, match="flash op missing"):
        h.float().sum().backward()
    assert x.grad is not None and torch.equal(x.grad, torch.full_like(x, 4.0))
    assert kept == [True] * 4  # two forwards, two recomputes: all kept the LSE, before and after the failure
    with torch.no_grad():
        attn.attention(x, k, k, cu, 0.5)
    assert kept[-1] is False  # no gradient: no LSE
