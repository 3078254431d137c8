"""Megatron modules whose forward is the kernel seam, with the native model's dtype policy (top_rl/dtypes.py).

Each class has the constructor signature Megatron's spec builders call and returns what the stock
module returns, so it drops into the local layer spec (top_rl/train/qwen3_megatron.py). Where the seam and the native model
cast (top_rl/dtypes.py, the native model):
  - residual-stream norms (input, pre-MLP, final) take the fp32 stream; the native model's fp32 output is read
    only by the next GEMM, which rounds it, so the norm kernel writes it rounded to the compute dtype;
  - q/k norms take the compute-dtype projection and output fp32 (fp32 weight x n rounded to compute),
    RoPE runs on that fp32 tensor through `kernels.rope` (SelfAttention below) and the core attention
    rounds q/k to the compute dtype;
  - every GEMM input is rounded to the compute dtype inside the linear (weights live in it already,
    the tied LM head rounds the fp32 embedding table per call);
  - Megatron's bias-dropout-add upcasts the sublayer output to the residual's dtype (fp32) and adds,
    which is the native model's f32(x) + residual (IEEE addition commutes), so it is kept.
Parameters carry Megatron's tensor-parallel attributes so its DDP/optimizer/grad-norm code on GPU
treats shards and replicas correctly.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from megatron.core import parallel_state
from megatron.core.tensor_parallel import copy_to_tensor_model_parallel_region
from megatron.core.tensor_parallel.layers import set_tensor_model_parallel_attributes
from megatron.core.transformer.attention import SelfAttention as MegatronSelfAttention
from megatron.core.transformer.mlp import MLP
from torch import nn

from top_rl import kernels

SEAM_ATTR = "top_seam"


@dataclass(frozen=True)
class SeamSettings:
    """What the seam modules need beyond Megatron's TransformerConfig (whose params_dtype is fp32, the
    dtype of the embedding and norms): recorded on the config object under SEAM_ATTR by
    the family's transformer_config, since Megatron's builders pass only the config."""

    compute_dtype: torch.dtype
    rope_theta: float
    max_positions: int
    megatron_rope: bool = False  # RoPE by Megatron's unfused path instead of kernels.rope (top_rl/train/qwen3_megatron.py)


def seam(config) -> SeamSettings:
    return getattr(config, SEAM_ATTR)


def compute_dtype(config) -> torch.dtype:
    return seam(config).compute_dtype


@functools.lru_cache(maxsize=8)
def _rope_table(head_dim: int, theta: float, max_positions: int, device: torch.device) -> torch.Tensor:
    return kernels.rope_cache(head_dim, theta, max_positions, device)  # computed on the device, as the native model does


def _device(config):
    return "cpu" if config.use_cpu_initialization else torch.cuda.current_device()


def _tp_group(tp_group):
    return tp_group if tp_group is not None else parallel_state.get_tensor_model_parallel_group()


class ResidualNorm(nn.Module):
    """RMSNorm of the fp32 residual stream with an fp32 weight (input/pre-MLP/final norm). The native model's
    output is fp32 and its only reader, the next GEMM, rounds it to the compute dtype; the norm returns it rounded
    already (same bits, no separate cast pass over [tokens, hidden])."""

    out_dtype: torch.dtype | None = torch.float32
    rounds_for_gemm = True

    def __init__(self, config, hidden_size: int, eps: float = 1e-6, **kwargs):
        super().__init__()
        self.eps = eps
        self.result_dtype = compute_dtype(config) if self.rounds_for_gemm else None
        self.weight = nn.Parameter(torch.ones(hidden_size, dtype=torch.float32, device=_device(config)))
        setattr(self.weight, "sequence_parallel", False)

    def forward(self, x):
        return kernels.rms_norm(x, self.weight, self.eps, out_dtype=self.out_dtype, result_dtype=self.result_dtype)


class QKNorm(ResidualNorm):
    """Per-head q/k RMSNorm: input in the compute dtype, output fp32 = w32 * round_c(n) (the native q_norm).

    With TP the weight is replicated but each rank normalises its own heads, so its gradient is
    partial: the optimizers sum it over TP (by name, as Megatron's finalize_model_grads does)."""

    out_dtype = None
    rounds_for_gemm = False  # RoPE reads the fp32 output


class ColumnLinear(nn.Module):
    """Column-parallel GEMM through `kernels.linear`: this rank's output rows, no gather (no bias)."""

    def __init__(self, input_size, output_size, *, config, init_method=None, bias=False, gather_output=False,
                 tp_group=None, skip_weight_param_allocation=False, stride=1, **kwargs):
        super().__init__()
        if bias or gather_output:
            raise ValueError("TOP linears have no bias and never gather their output (the contract's models have none)")
        self.tp_group = _tp_group(tp_group)
        tp = self.tp_group.size()
        if output_size % tp:
            raise ValueError(f"output size {output_size} does not split over TP={tp}")
        self.compute_dtype = compute_dtype(config)
        self.weight = None
        if not skip_weight_param_allocation:
            self.weight = nn.Parameter(torch.empty(output_size // tp, input_size, dtype=self.compute_dtype,
                                                   device=_device(config)))
            set_tensor_model_parallel_attributes(self.weight, True, 0, stride)

    def forward(self, x, weight=None, runtime_gather_output=None):
        w = self.weight if weight is None else weight
        if self.tp_group.size() > 1:  # identity forward; sums the input gradient over TP in backward
            x = copy_to_tensor_model_parallel_region(x, group=self.tp_group)
        return kernels.linear(x.to(self.compute_dtype), w.to(self.compute_dtype)), None


class RowLinear(nn.Module):
    """Row-parallel GEMM through `kernels.row_linear`: K is split over TP and the seam gathers the
    K-chunk partials and sums them in global order, so the output has the TP=1 bits (replicated)."""

    def __init__(self, input_size, output_size, *, config, init_method=None, bias=False, input_is_parallel=True,
                 tp_group=None, **kwargs):
        super().__init__()
        if bias or not input_is_parallel:
            raise ValueError("TOP row linears take parallel input and have no bias")
        self.tp_group = _tp_group(tp_group)
        tp = self.tp_group.size()
        if input_size % tp:
            raise ValueError(f"input size {input_size} does not split over TP={tp}")
        self.compute_dtype = compute_dtype(config)
        self.weight = nn.Parameter(torch.empty(output_size, input_size // tp, dtype=self.compute_dtype,
                                               device=_device(config)))
        set_tensor_model_parallel_attributes(self.weight, True, 1, 1)

    def forward(self, x):
        group = self.tp_group if self.tp_group.size() > 1 else None
        return kernels.row_linear(x.to(self.compute_dtype), self.weight, group), None


class SelfAttention(MegatronSelfAttention):
    """Megatron's self-attention with RoPE through the seam: `kernels.rope` (the engine's own RoPE
    kernel; the sglang backend compiles it exactly as SGLang does) on the fp32 q/k-norm outputs, with
    the engine's cos/sin table and each token's position within its packed sequence
    (`PackedSeqParams.positions`, top_rl.train.batch). Megatron's rotary embedding is not used."""

    def forward(self, *args, rotary_pos_emb=None, packed_seq_params=None, **kwargs):
        if packed_seq_params is None or getattr(packed_seq_params, "positions", None) is None:
            raise ValueError("the TOP trainer feeds packed THD batches with positions (top_rl.train.batch.pack_micro_batch)")
        self._positions = packed_seq_params.positions
        return super().forward(*args, rotary_pos_emb=None, packed_seq_params=packed_seq_params, **kwargs)

    def get_query_key_value_tensors(self, hidden_states, key_value_states=None, output_gate=False, split_qkv=True):
        q, k, v = super().get_query_key_value_tensors(hidden_states, key_value_states, output_gate=output_gate,
                                                      split_qkv=split_qkv)
        s = seam(self.config)
        table = _rope_table(q.shape[-1], s.rope_theta, s.max_positions, q.device)

        def rope(x):  # [t, 1, heads, d] (THD keeps a batch dim of 1 here)
            return kernels.rope(x.reshape(x.shape[0], -1, x.shape[-1]), self._positions, table).reshape(x.shape)

        return rope(q), rope(k), v


class CoreAttention(nn.Module):
    """Varlen causal attention over packed THD sequences through `kernels.attention`.

    Receives q/k after RoPE (fp32, contract §4.5) and v in the compute dtype; rounds q/k to the
    compute dtype, exactly where the native model does. GQA is passed unexpanded, as the seam expects.
    Context parallelism (Ulysses) wraps this call: see top_rl.train.ulysses."""

    def __init__(self, config, layer_number, attn_mask_type=None, attention_type="self", cp_comm_type=None,
                 softmax_scale=None, pg_collection=None, **kwargs):
        super().__init__()
        self.compute_dtype = compute_dtype(config)
        self.scale = config.kv_channels ** -0.5  # the native model's head_dim ** -0.5 (same Python float)
        self.cp_group = getattr(pg_collection, "cp", None) if pg_collection is not None else None

    def forward(self, query, key, value, attention_mask=None, attn_mask_type=None, attention_bias=None,
                packed_seq_params=None, **kwargs):
        if packed_seq_params is None or packed_seq_params.qkv_format != "thd":
            raise ValueError("the TOP trainer feeds packed THD batches only (PackedSeqParams(qkv_format='thd'))")
        c = self.compute_dtype
        q, k, v = query.to(c), key.to(c), value.to(c)
        # The batch's own tensor, not a per-layer copy: kernels read its values on the host once per tensor
        # (top_rl/kernels/packed_batch.py).
        cu = packed_seq_params.cu_seqlens_q
        if self.cp_group is not None and self.cp_group.size() > 1:
            from top_rl.train.ulysses import ulysses_attention

            out = ulysses_attention(q, k, v, packed_seq_params, self.scale, self.cp_group)
        else:
            out = kernels.attention(q, k, v, cu, self.scale)
        return out.reshape(out.shape[0], -1)


class SwiGLUMLP(MLP):
    """Megatron's MLP with the activation routed through `kernels.silu_and_mul` (fc1 = [gate; up])."""

    def forward(self, hidden_states, per_token_scale=None, **kwargs):
        gate_up, _ = self.linear_fc1(hidden_states)
        out, _ = self.linear_fc2(kernels.silu_and_mul(gate_up))
        return out, None


class OutputLayer(ColumnLinear):
    """Vocab-parallel LM head. Untied: its own weight in the compute dtype. Tied: on the embedding's
    stage GPTModel passes the fp32 embedding table as `weight`; on a later pipeline stage this holds an
    fp32 copy (`top_tied_copy`), kept equal to the embedding by the trainer (load + grad all-reduce)."""

    def __init__(self, config, hidden_size: int, vocab_size: int, tied: bool, pre_process: bool, tp_group=None):
        super().__init__(hidden_size, vocab_size, config=config, tp_group=tp_group,
                         skip_weight_param_allocation=tied)
        if tied and not pre_process:
            tp = self.tp_group.size()
            self.weight = nn.Parameter(torch.empty(vocab_size // tp, hidden_size, dtype=torch.float32,
                                                   device=_device(config)))
            set_tensor_model_parallel_attributes(self.weight, True, 0, 1)
            self.weight.top_tied_copy = True
            # Megatron's markers for this copy: grads all-reduced with the embedding's
            # (finalize_model_grads), excluded from the grad norm so the tied weight counts once.
            self.weight.shared = True
            self.weight.shared_embedding = True
        self.sequence_parallel = False
