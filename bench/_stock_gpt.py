"""The stock baseline of bench/trainer_step.py: what a Megatron-core user trains Qwen3 with on this machine.

Megatron-core 0.19.2's own GPTModel and local layer spec (no Transformer Engine, no apex here), bf16 weights
with fp32 master weights (as Megatron-LM's bf16 training), bf16 residual stream,
cuBLAS GEMMs (ColumnParallelLinear/RowParallelLinear), Megatron's fused SwiGLU and bias-dropout-add, and the
GPU trainer's optimizer (Megatron DDP + torch's fused AdamW, sync-free grad norm: top_rl.train.optim.GpuAdamW).
Where Megatron's no-TE path is slow or absent, the fastest stock piece is used instead:
  RMSNorm     Liger-Kernel's Triton RMSNorm on CUDA (what slime/miles users get from TE's fused norm; Megatron's
              no-TE choice, torch.nn.RMSNorm, ran at 4-5x its bandwidth bound here), torch's on CPU or when
              liger_kernel is not importable (then said in the table notes);
  attention   the fastest correct of torch's fused varlen kernels (bench/_stock_attention.py); Megatron's
              local DotProductAttention materialises the score matrix and does not take packed sequences;
  RoPE        one torch.compile'd kernel on cos/sin gathered by position once per micro-batch, not per layer
              (Megatron's unfused THD RoPE loops over sequences with a host sync; its fused THD RoPE needs TE);
  LM head     the scored rows only, one cuBLAS GEMM, then a chunked fused fp32 log-softmax (torch.compile)
              instead of Megatron's full-logits cross-entropy (16k x 152k fp32 logits would be 10 GB).
Recompute (when on) is full/uniform/1 layer through torch's non-reentrant checkpoint, as the TOP trainer's.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from megatron.core.models.gpt import GPTModel
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.transformer import TransformerConfig
from megatron.core.transformer.attention import SelfAttention as MegatronSelfAttention
from torch import nn
from torch.autograd.profiler import record_function

from bench import _stock_attention
from top_rl.model import Qwen3Config

LOGIT_CHUNK = 4096  # rows per fused log-softmax chunk (bounds the fp32 temporaries)
_compiled_ok = {"rope": True, "lsm": True}  # flipped off (and reported) if torch.compile fails here
_fused_norm = {"liger": None}  # LigerRMSNormFunction once use_fused_norm() found it importable on CUDA


def transformer_config(cfg: Qwen3Config, *, recompute: bool, cpu: bool) -> TransformerConfig:
    return TransformerConfig(
        num_layers=cfg.num_hidden_layers, hidden_size=cfg.hidden_size, ffn_hidden_size=cfg.intermediate_size,
        num_attention_heads=cfg.num_attention_heads, num_query_groups=cfg.num_key_value_heads,
        kv_channels=cfg.head_dim, normalization="RMSNorm", layernorm_epsilon=cfg.rms_norm_eps, qk_layernorm=True,
        gated_linear_unit=True, activation_func=F.silu, add_bias_linear=False, add_qkv_bias=False,
        hidden_dropout=0.0, attention_dropout=0.0,
        bias_activation_fusion=True, bias_dropout_fusion=True,  # Megatron's own fused SwiGLU / bias-dropout-add
        masked_softmax_fusion=False, apply_rope_fusion=False, gradient_accumulation_fusion=False,
        persist_layer_norm=False, fp32_residual_connection=False,
        bf16=True, params_dtype=torch.bfloat16, pipeline_dtype=torch.bfloat16,
        tensor_model_parallel_size=1, pipeline_model_parallel_size=1, context_parallel_size=1,
        sequence_parallel=False, use_cpu_initialization=cpu, perform_initialization=False,
        recompute_granularity="full" if recompute else None, recompute_method="uniform" if recompute else None,
        recompute_num_layers=1 if recompute else None,
    )


# ------------------------------------------------------------------------------------------------ RoPE
@functools.lru_cache(maxsize=4)
def _rope_table(head_dim: int, theta: float, max_positions: int, device) -> torch.Tensor:
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=device) / head_dim))
    freqs = torch.outer(torch.arange(max_positions, dtype=torch.float32, device=device), inv)
    emb = torch.cat((freqs, freqs), dim=-1)
    return torch.stack((emb.cos(), emb.sin()))  # [2, P, d] fp32


def _rope_eager(x, cos, sin):  # NeoX: x * cos + rotate_half(x) * sin, x [T, h, d], cos/sin [T, 1, d]
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


_rope_compiled = torch.compile(_rope_eager, dynamic=True)


def _rope_fn(x, cos, sin):
    if _compiled_ok["rope"]:
        return _rope_compiled(x, cos, sin)
    return _rope_eager(x, cos, sin)


class _StockRope(torch.autograd.Function):
    """Backward of a rotation is the rotation by -angle: rope(g, cos, -sin) (sin is the same on both halves)."""

    @staticmethod
    def forward(ctx, x, cos, sin):
        ctx.save_for_backward(cos, sin)
        return _rope_fn(x, cos, sin)

    @staticmethod
    def backward(ctx, g):
        cos, sin = ctx.saved_tensors
        return _rope_fn(g.contiguous(), cos, -sin), None, None


class StockSelfAttention(MegatronSelfAttention):
    """Megatron's self-attention with RoPE applied to q/k by each token's position in its packed sequence."""

    def forward(self, *args, rotary_pos_emb=None, packed_seq_params=None, **kwargs):
        self._packed = packed_seq_params
        return super().forward(*args, rotary_pos_emb=None, packed_seq_params=packed_seq_params, **kwargs)

    def _cos_sin(self, dtype):
        """cos/sin [T, 1, d] in q/k's dtype, gathered once per micro-batch (kept on its packed_seq_params): every
        layer has the same positions."""
        p = self._packed
        cache = p.__dict__.setdefault("_bench_rope", {})
        if dtype not in cache:
            table = _rope_table(self.config.kv_channels, self.config.bench_rope_theta,
                                self.config.bench_max_positions, p.positions.device)
            cs = table.index_select(1, p.positions).unsqueeze(2).to(dtype)  # fp32 table, rounded once
            cache[dtype] = (cs[0], cs[1])
        return cache[dtype]

    def get_query_key_value_tensors(self, hidden_states, key_value_states=None, output_gate=False, split_qkv=True):
        q, k, v = super().get_query_key_value_tensors(hidden_states, key_value_states, output_gate=output_gate,
                                                      split_qkv=split_qkv)

        def rope(x):  # [t, 1, heads, d]
            with record_function("bench::rope"):
                cos, sin = self._cos_sin(x.dtype)
                y = _StockRope.apply(x.reshape(x.shape[0], -1, x.shape[-1]), cos, sin)
            return y.reshape(x.shape)

        return rope(q), rope(k), v


class StockCoreAttention(nn.Module):
    def __init__(self, config, layer_number, attn_mask_type=None, attention_type="self", cp_comm_type=None,
                 softmax_scale=None, pg_collection=None, **kwargs):
        super().__init__()
        self.scale = config.kv_channels ** -0.5

    def forward(self, query, key, value, attention_mask=None, attn_mask_type=None, attention_bias=None,
                packed_seq_params=None, **kwargs):
        p = packed_seq_params
        cu = p.cu_seqlens_q.to(torch.int32)
        out = _stock_attention.attention(query.contiguous(), key.contiguous(), value.contiguous(), cu,
                                         int(p.max_seqlen_q), self.scale)
        return out.reshape(out.shape[0], -1)


class FusedRMSNorm(nn.Module):
    """Megatron's norm interface (config, hidden_size, eps) over Liger-Kernel's Triton RMSNorm (Llama casting:
    the normalisation in fp32, the weight applied in the input's dtype)."""

    def __init__(self, config, hidden_size: int, eps: float = 1e-5, **_):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x):
        return _fused_norm["liger"].apply(x.contiguous(), self.weight, self.eps, 0.0, "llama", False)


def use_fused_norm(device) -> list[str]:
    """Liger's RMSNorm for layer_spec() on CUDA when liger_kernel imports; a note for the table otherwise."""
    if device.type != "cuda":
        return []
    try:
        from liger_kernel.ops.rms_norm import LigerRMSNormFunction
    except Exception as e:  # noqa: BLE001 - reported in the table notes, torch's RMSNorm is used
        return [f"liger_kernel not importable ({type(e).__name__}: {str(e).splitlines()[0][:120]}); "
                "torch.nn.RMSNorm used"]
    _fused_norm["liger"] = LigerRMSNormFunction
    return []


def layer_spec():
    spec = get_gpt_layer_local_spec(qk_layernorm=True, normalization="RMSNorm")
    if _fused_norm["liger"] is not None:
        spec.submodules.input_layernorm = spec.submodules.pre_mlp_layernorm = FusedRMSNorm
        spec.submodules.self_attention.submodules.q_layernorm = FusedRMSNorm
        spec.submodules.self_attention.submodules.k_layernorm = FusedRMSNorm
    spec.submodules.self_attention.module = StockSelfAttention
    spec.submodules.self_attention.submodules.core_attention = StockCoreAttention
    return spec


def build_model(cfg: Qwen3Config, tc: TransformerConfig, device) -> GPTModel:
    tc.bench_rope_theta, tc.bench_max_positions = float(cfg.rope_theta), cfg.max_position_embeddings  # for the RoPE
    model = GPTModel(config=tc, transformer_layer_spec=layer_spec(), vocab_size=cfg.vocab_size,
                     max_sequence_length=cfg.max_position_embeddings, pre_process=True, post_process=True,
                     parallel_output=True, share_embeddings_and_output_weights=cfg.tie_word_embeddings,
                     position_embedding_type="none")
    return model.to(device=device, dtype=torch.bfloat16)  # what Megatron-LM's Float16Module does to a bf16 model


# ------------------------------------------------------------------------------------ log-probs (LM head)
def _acc(t):  # fp32 for bf16 logits; fp64 stays fp64 (gradcheck)
    return t.to(torch.promote_types(t.dtype, torch.float32))


def _lse_eager(logits):
    return torch.logsumexp(_acc(logits), dim=-1)


def _grad_eager(logits, lse, targets, g):
    """d lp / d logits * g for lp = logits[target] - lse: (onehot - softmax) * g, in the logits dtype."""
    p = torch.exp(_acc(logits) - lse.unsqueeze(-1))
    onehot = torch.zeros_like(p).scatter_(-1, targets.unsqueeze(-1), 1.0)
    return ((onehot - p) * g.unsqueeze(-1)).to(logits.dtype)


_lse_compiled = torch.compile(_lse_eager, dynamic=True)
_grad_compiled = torch.compile(_grad_eager, dynamic=True)


def _lse(logits):
    return _lse_compiled(logits) if _compiled_ok["lsm"] else _lse_eager(logits)


def _grad(logits, lse, targets, g):
    return _grad_compiled(logits, lse, targets, g) if _compiled_ok["lsm"] else _grad_eager(logits, lse, targets, g)


class _Logprobs(torch.autograd.Function):
    """lp[r] = log_softmax(h[r] @ W.T)[target[r]] in fp32. One cuBLAS GEMM for all rows (bf16 logits kept, as
    the TOP trainer keeps its own), fp32 log-sum-exp and its gradient chunkwise, two cuBLAS GEMMs backward."""

    @staticmethod
    def forward(ctx, h, w, targets):
        logits = h @ w.t()
        lse = torch.cat([_lse(logits[i:i + LOGIT_CHUNK]) for i in range(0, logits.shape[0], LOGIT_CHUNK)])
        lp = _acc(logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1)) - lse
        ctx.save_for_backward(h, w, targets, logits, lse)
        return lp

    @staticmethod
    def backward(ctx, g):
        h, w, targets, logits, lse = ctx.saved_tensors
        g = _acc(g)
        gl = torch.empty_like(logits)
        for i in range(0, logits.shape[0], LOGIT_CHUNK):
            sl = slice(i, i + LOGIT_CHUNK)
            gl[sl] = _grad(logits[sl], lse[sl], targets[sl], g[sl])
        gh = gl @ w if ctx.needs_input_grad[0] else None
        gw = gl.t() @ h if ctx.needs_input_grad[1] else None
        return gh, gw, None


def make_output_processor():
    """GPTModel output_processor: the micro-batch's flat fp32 log-probs of its scored rows (top_rl.train.batch
    MicroBatch as context; this batch has only sampler-kind rows at T = 1, i.e. plain log-probs)."""

    @record_function("bench::logprobs")
    def processor(*, hidden_states, output_layer, output_weight, context, **_):
        mb = context
        h = hidden_states.reshape(hidden_states.shape[0], -1)
        w = output_weight if output_weight is not None else output_layer.weight
        flat = h.new_zeros(mb.num_scored, dtype=torch.float32)
        for rows, targets, dest in ((mb.prefill_rows, mb.prefill_targets, mb.prefill_dest),
                                    (mb.sample_rows, mb.sample_targets, mb.sample_dest)):
            if rows.numel():
                flat = flat.index_put((dest,), _Logprobs.apply(h.index_select(0, rows), w, targets))
        return flat

    return processor


def try_compile(device) -> list[str]:
    """Run each compiled piece once on tiny inputs; a failure switches that piece to eager and is reported."""
    notes = []
    x = torch.randn(8, 2, 16, device=device)
    cs = torch.randn(8, 1, 16, device=device)
    logits = torch.randn(8, 32, device=device)
    for key, run in (("rope", lambda: _rope_compiled(x, cs, cs)),
                     ("lsm", lambda: _grad_compiled(logits, _lse_compiled(logits), torch.zeros(8, dtype=torch.long,
                                                                                               device=device),
                                                    torch.ones(8, device=device)))):
        try:
            run()
        except Exception as e:  # noqa: BLE001 - reported in the table notes, the eager version is used
            _compiled_ok[key] = False
            notes.append(f"torch.compile of {key} failed ({type(e).__name__}: {str(e).splitlines()[0][:120]}); eager used")
    return notes


def prepare(device) -> list[str]:
    """Everything the stock trainer settles before its model is built; the notes say what fell back."""
    return try_compile(device) + use_fused_norm(device)
