"""`sglang` backend: SGLang 0.5.11's own kernels in the forward, analytic backwards (GPU only).

Forward = what the engine runs in rl mode (docs/numerics.md §2, §4), by calling the pinned wheel's code:
  linear        `matmul_persistent(x, W.t())` (mm_BI), as F.linear -> aten::mm under the engine's override; the
                GEMM inside it is the one the installed KernelPlan's contract names (`gemm`: SGLang's Triton persistent
                kernel, or DeepGEMM's bf16_gemm_nn), pinned through SGLang's env switch as on the engine
  rms_norm      RMSNorm.forward_native with `mean` = `mean_dim` (mean_BI); pow/rsqrt/mul are native ops (on CUDA
                the elementwise ops around mean_BI run as two Triton passes, bitwise the same: fused_forward.py)
  rope          torch.compile(dynamic=True)(sglang...rotary_embedding.utils.apply_rotary_emb), NeoX
  silu_and_mul  SiluAndMul.forward_native: F.silu(g[..., :I]) * g[..., I:] (native, as rl mode forces; on CUDA
                one Triton pass, bitwise the same)
  log-probs     `log_softmax` (lsm_BI): fp32 for the prefill path, bf16 in/out for the sampler path (on CUDA the
                trainer's token log-probs come from one Triton kernel that repeats lsm_BI's row reductions and
                writes only the gathered column, bitwise the same: logprob_triton.py)
  attention     attention.py (the engine's --attention-backend kernel)
Backwards use native torch ops (cuBLAS GEMMs; RMSNorm, RoPE and SiLU-and-mul each one kernel compiled from the
reference backend's formula, backward.py): gradients need to be right, not batch-invariant;
only the forward log-probs are compared bitwise.

Row-parallel linear (TP-invariant): every rank all-gathers the K shards of the input and of the weight and
runs ONE full-K mm_BI. Summing per-shard partials (the reference backend's way) cannot reproduce mm_BI's
single fp32 accumulator walked over all of K, and a TP=1 engine runs exactly one full-K mm_BI, so the
full-K GEMM is what gives the engine's bits at any trainer TP degree. Cost: an all-gather of the weight
shard per call (a row-parallel weight is at most hidden x ffn; cheap next to the GEMM at training sizes).
"""

from __future__ import annotations

import functools
from types import SimpleNamespace

import torch
import torch.distributed as dist

from top_rl import contract as _contract
from top_rl.kernels import checkpoint_pass
from top_rl.kernels import fallback as _fallback
from top_rl.kernels import plan as _plan
from top_rl.kernels import reference as _ref
from top_rl.kernels.sglang import attention as _attention
from top_rl.kernels.sglang import backward as _fused
from top_rl.kernels.sglang import engine_env
from top_rl.kernels.sglang import fused_forward as _fused_forward
from top_rl.kernels.sglang.engine_env import active_contract, check_plan, pin_engine_env  # noqa: F401 (its API)

@functools.cache
def ops() -> SimpleNamespace:
    """SGLang's kernels, imported on first use (a CPU process that never calls them never imports Triton)."""
    top = active_contract()
    pin_engine_env(top)
    from sglang.srt.batch_invariant_ops import batch_invariant_ops as bio

    apply_rotary_emb = _wheel_apply_rotary_emb()
    engine_env.check_gemm_path(top, bool(bio._ENABLE_MM_DEEPGEMM and bio.ENABLE_JIT_DEEPGEMM))
    if top.gemm == "deepgemm":
        from top_rl.kernels.sglang import deep_gemm_source

        src = _contract.DEEPGEMM_SOURCE
        deep_gemm_source.check(bio.deep_gemm, src["sources_sha256"], src["rev"], src["package"])
    engine_env.loaded_under = top.name
    return SimpleNamespace(
        mm=bio.matmul_persistent,
        mean=bio.mean_dim,
        log_softmax=bio.log_softmax,
        rope=torch.compile(dynamic=True)(apply_rotary_emb),  # the engine compiles the same function the same way
    )


def _wheel_apply_rotary_emb():
    """The wheel's apply_rotary_emb. Its package __init__ (RotaryEmbedding's module) imports CUDA-only JIT
    kernels; if that import fails where sglang-kernel is absent, load the one file utils.py by path."""
    try:
        from sglang.srt.layers.rotary_embedding.utils import apply_rotary_emb

        return apply_rotary_emb
    except Exception:  # noqa: BLE001 - any failure of the package import; the file itself needs no GPU libs
        import importlib.util
        import pathlib

        import sglang

        path = pathlib.Path(sglang.__file__).parent / "srt/layers/rotary_embedding/utils.py"
        spec = importlib.util.spec_from_file_location("_top_rl_sglang_rope_utils", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod.apply_rotary_emb


def mm_bi(x2d: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x2d[M, K] @ w[N, K].T through mm_BI, with the engine's operand layout (a contiguous, b = W.t())."""
    if x2d.dtype != w.dtype:
        raise TypeError(f"linear operands must share a dtype (engine asserts it): {x2d.dtype} vs {w.dtype}")
    if x2d.shape[0] == 0:
        return x2d.new_empty((0, w.shape[0]))
    return ops().mm(x2d.contiguous(), w.contiguous().t())


def _gemm(x2d: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """The linear layer's forward GEMM: the engine's mm_BI, except in the recompute inside the backward with
    top.fast_paths.recompute_gemm, where the output only feeds the backward (the gated forward, whose bits the engine
    must match, ran mm_BI in the layer's first pass): there cuBLAS, whatever bits it gives."""
    if checkpoint_pass.current() == checkpoint_pass.RECOMPUTE and _plan.current().fast_paths.recompute_gemm:
        _fallback.took("linear_recompute", "cublas")
        return x2d @ w.t()
    return mm_bi(x2d, w)


class _Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w):
        x2 = x.reshape(-1, x.shape[-1])
        ctx.save_for_backward(x2, w)
        ctx.x_shape = x.shape
        return _gemm(x2, w).reshape(*x.shape[:-1], w.shape[0])

    @staticmethod
    def backward(ctx, g):
        x2, w = ctx.saved_tensors
        g2 = g.reshape(-1, g.shape[-1])
        gx = (g2 @ w).reshape(ctx.x_shape) if ctx.needs_input_grad[0] else None
        gw = g2.t() @ x2 if ctx.needs_input_grad[1] else None
        return gx, gw


def linear(x, w):
    return _Linear.apply(x, w)


def _all_gather_last(t: torch.Tensor, group) -> torch.Tensor:
    parts = [torch.empty_like(t) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, t.contiguous(), group=group)
    return torch.cat(parts, dim=-1)


class _RowLinear(torch.autograd.Function):
    """x[..., K/tp] and w[N, K/tp] on each rank; output replicated. Forward: one full-K mm_BI on gathered
    shards (module docstring). Backward needs no communication: the incoming gradient is the full one."""

    @staticmethod
    def forward(ctx, x, w, group):
        x2 = x.reshape(-1, x.shape[-1])
        ctx.save_for_backward(x2, w)
        ctx.x_shape = x.shape
        out = _gemm(_all_gather_last(x2, group), _all_gather_last(w, group))
        return out.reshape(*x.shape[:-1], w.shape[0])

    @staticmethod
    def backward(ctx, g):
        gx, gw = _Linear.backward(ctx, g)
        return gx, gw, None


def row_linear(x, w, group=None):
    if group is None or dist.get_world_size(group) == 1:
        return _Linear.apply(x, w)
    return _RowLinear.apply(x, w, group)


class _RMSNorm(_ref._RMSNorm):
    """forward_native (weight fp32, cast_x_before_out_mul, fp32 residual) with mean = mean_BI, on CUDA as two
    Triton passes around mean_BI with the same bits (fused_forward.py); the reference's analytic backward,
    fused."""

    @staticmethod
    def forward(ctx, x, w, residual, eps, out_dtype, result_dtype):
        out, new_residual, n, rstd, n_cast = _fused_forward.rms_norm(x, w, residual, eps, out_dtype or x.dtype,
                                                                     ops().mean, result_dtype)
        ctx.save_for_backward(n, rstd, w, n_cast)
        ctx.dtypes = (x.dtype, None if residual is None else residual.dtype)
        return out if residual is None else (out, new_residual)

    @staticmethod
    def backward(ctx, g_out, g_res=None):
        n, rstd, w, n_cast = ctx.saved_tensors
        g_x, g_w, g_r = _fused.rms_norm_grads(g_out, g_res, n, rstd, w, n_cast, *ctx.dtypes)
        return g_x, g_w, g_r, None, None, None


def rms_norm(x, w, eps, residual=None, out_dtype=None, result_dtype=None):
    return _RMSNorm.apply(x, w, residual, eps, out_dtype, result_dtype)


class _Rope(_ref._Rope):
    """RotaryEmbedding.forward_native in rl mode: cos/sin = cache[positions].chunk(2), then the compiled
    apply_rotary_emb(x, cos, sin, is_neox_style=True); the reference's analytic backward, fused."""

    @staticmethod
    def forward(ctx, x, positions, cos_sin):
        cos, sin = cos_sin.index_select(0, positions.flatten()).chunk(2, dim=-1)
        out = ops().rope(x, cos, sin, True)
        ctx.save_for_backward(cos.unsqueeze(-2).to(x.dtype), sin.unsqueeze(-2).to(x.dtype))
        return out

    @staticmethod
    def backward(ctx, g):
        cos, sin = ctx.saved_tensors
        return _fused.rope_grad(g, cos, sin), None, None


def rope(x, positions, cos_sin):
    return _Rope.apply(x, positions, cos_sin)


def _sampler_input(logits, temperature):
    """§6.2 step 1: bf(f32(bf(L)) / T) with T an fp32 CUDA tensor of shape (rows, 1), in the logits dtype."""
    return logits.div(temperature.reshape(-1, 1)).to(logits.dtype)


def _sampler_logprobs_eager(logits, ids, temperature):
    return _fused_forward.token_logprobs(_sampler_input(logits, temperature), ids, ops().log_softmax)


class _TokenLogprobs(torch.autograd.Function):
    """lsm_BI gathered at ids. temperature None: prefill path (§6.1, fp32 of f32(L)); else the sampler path
    (§6.2; on CUDA one fused pass that rounds bf(L / T) itself and keeps each row's max + log-sum-exp).
    Backward: (onehot - softmax(z)) * g / T, softmax recomputed from the saved logits (no [T, V] fp32 log-probs
    kept alive): one Triton pass from the kept shift, else one compiled kernel (backward.py)."""

    @staticmethod
    def forward(ctx, logits, ids, temperature):
        shift = None
        if temperature is None:
            lp = _fused_forward.token_logprobs(logits.float(), ids, ops().log_softmax)
        else:
            lp, shift = _fused_forward.sampler_logprobs(logits, ids, temperature, _sampler_logprobs_eager)
        none = logits.new_empty(0)
        ctx.save_for_backward(logits, ids, none if temperature is None else temperature,
                              none if shift is None else shift)
        ctx.tempered, ctx.fused = temperature is not None, shift is not None
        return lp

    @staticmethod
    def backward(ctx, g):
        logits, ids, t, shift = ctx.saved_tensors
        if ctx.fused:
            return _fused.sampler_logprobs_grad(logits, ids, t, shift, g), None, None
        return _fused.token_logprobs_grad(logits, ids, t if ctx.tempered else None, g), None, None


def prefill_logprobs(logits, ids):
    return _TokenLogprobs.apply(logits, ids, None)


def sample_logprobs(logits, ids, temperature):
    return _TokenLogprobs.apply(logits, ids, _ref._as_temperature(temperature, logits))


@torch.no_grad()
def sampler_log_softmax(logits, temperature):
    return ops().log_softmax(_sampler_input(logits, _ref._as_temperature(temperature, logits)), dim=-1)


silu_and_mul = _fused.silu_and_mul  # native F.silu * mul forward, as SGLang rl mode
attention = _attention.attention
decode_attention = _attention.decode_attention
