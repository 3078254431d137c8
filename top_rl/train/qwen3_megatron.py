"""Dense Qwen3 as a megatron-core GPTModel with the TOP layer spec (the trainer's model for this family).

The spec is Megatron's local spec (`get_gpt_layer_local_spec(qk_layernorm=True, normalization="RMSNorm")`)
with every op that touches a log-prob substituted by a seam module (top_rl.train.layers); see
docs/megatron.md §3.2 for the substitution points.

RoPE. Megatron's own unfused, non-interleaved RoPE (`apply_rope_fusion=False`) is bitwise our eager
`kernels.rope` (= SGLang's NeoX forward_native) on fp32 and bf16 (tests/train/test_train_rope.py), and Megatron
applies it right after the q/k norms, i.e. on their fp32 outputs, before the core attention rounds q/k:
the contract's order. But SGLang in rl mode runs RoPE through torch.compile, which the GPU `sglang`
backend reproduces, and a compiled RoPE is not bitwise the eager one. So by default the spec's
SelfAttention applies RoPE through `kernels.rope` at the same point (and GPTModel builds no rotary
table, `position_embedding_type="none"`); `megatron_rope=True` keeps Megatron's path instead, valid
only when the engine's RoPE is the eager formula (the CPU `reference` backend).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from megatron.core.models.gpt import GPTModel
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.transformer import TransformerConfig
from megatron.core.transformer.mlp import MLPSubmodules
from megatron.core.transformer.spec_utils import ModuleSpec
from megatron.core.transformer.transformer_block import TransformerBlockSubmodules, get_num_layers_to_build

from top_rl.model.qwen3.config import Qwen3Config
from top_rl.train import layers
from top_rl.train.layers import SEAM_ATTR, SeamSettings


def transformer_config(cfg: Qwen3Config, *, compute_dtype: torch.dtype, tp: int = 1, pp: int = 1, cp: int = 1,
                       recompute: bool = False, cpu: bool = True, megatron_rope: bool = False) -> TransformerConfig:
    """Megatron config for a dense Qwen3 under the TOP contract (reference §3.1, §10).

    params_dtype is fp32 because the embedding and every norm weight are fp32 (contract DtypePolicy);
    the seam linears allocate their weights in the compute dtype themselves. The residual stream, and so
    the pipeline's point-to-point activations, are fp32. Dropout 0, all fusions off, no sequence
    parallelism. Recompute, when on, is full/uniform/1 layer through the non-reentrant checkpoint
    (top_rl.train.recompute)."""
    tc = TransformerConfig(
        num_layers=cfg.num_hidden_layers,
        hidden_size=cfg.hidden_size,
        ffn_hidden_size=cfg.intermediate_size,
        num_attention_heads=cfg.num_attention_heads,
        num_query_groups=cfg.num_key_value_heads,
        kv_channels=cfg.head_dim,
        normalization="RMSNorm",
        layernorm_epsilon=cfg.rms_norm_eps,
        qk_layernorm=True,
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        add_qkv_bias=False,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        bias_activation_fusion=False,
        bias_dropout_fusion=False,
        masked_softmax_fusion=False,
        apply_rope_fusion=False,
        rotary_interleaved=False,
        gradient_accumulation_fusion=False,
        persist_layer_norm=False,
        fp32_residual_connection=True,
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
        context_parallel_size=cp,
        sequence_parallel=False,
        params_dtype=torch.float32,
        pipeline_dtype=torch.float32,
        use_cpu_initialization=cpu,
        perform_initialization=False,  # weights always come from load_hf (HF or our seeded init)
        deterministic_mode=True,
        recompute_granularity="full" if recompute else None,
        recompute_method="uniform" if recompute else None,
        recompute_num_layers=1 if recompute else None,
    )
    setattr(tc, SEAM_ATTR, SeamSettings(compute_dtype, float(cfg.rope_theta), cfg.max_position_embeddings,
                                        megatron_rope))
    return tc


def top_layer_spec(megatron_rope: bool = False) -> ModuleSpec:
    """The local GPT layer spec with the seam substituted at every numerics-bearing submodule."""
    spec = get_gpt_layer_local_spec(qk_layernorm=True, normalization="RMSNorm")
    sub = spec.submodules
    if not megatron_rope:
        sub.self_attention.module = layers.SelfAttention
    sub.input_layernorm = layers.ResidualNorm
    sub.pre_mlp_layernorm = layers.ResidualNorm
    attn = sub.self_attention.submodules
    attn.linear_qkv = layers.ColumnLinear
    attn.linear_proj = layers.RowLinear
    attn.core_attention = layers.CoreAttention
    attn.q_layernorm = layers.QKNorm
    attn.k_layernorm = layers.QKNorm
    sub.mlp = functools.partial(
        layers.SwiGLUMLP.as_mlp_submodule,
        submodules=MLPSubmodules(linear_fc1=layers.ColumnLinear, linear_fc2=layers.RowLinear),
    )
    return spec


def build_gpt_model(cfg: Qwen3Config, tc: TransformerConfig, *, pp_rank: int, device) -> GPTModel:
    """This pipeline stage's GPTModel. The final norm comes from the block spec; the LM head is replaced
    by the seam's OutputLayer after construction (GPTModel builds it directly, not from a spec)."""
    pp = tc.pipeline_model_parallel_size
    pre, post = pp_rank == 0, pp_rank == pp - 1
    n_local = get_num_layers_to_build(tc, pp_rank=pp_rank)
    megatron_rope = layers.seam(tc).megatron_rope
    block = TransformerBlockSubmodules(layer_specs=[top_layer_spec(megatron_rope)] * n_local,
                                       layer_norm=layers.ResidualNorm)
    model = GPTModel(
        config=tc,
        transformer_layer_spec=block,
        vocab_size=cfg.vocab_size,
        max_sequence_length=cfg.max_position_embeddings,
        pre_process=pre,
        post_process=post,
        parallel_output=True,
        # Built untied so GPTModel allocates no CUDA-synced tied copy; tying is restored below on the
        # seam head (the tied copy on a later PP stage is handled by the trainer, not Megatron's init).
        share_embeddings_and_output_weights=False,
        position_embedding_type="rope" if megatron_rope else "none",
        rotary_percent=1.0,
        rotary_base=cfg.rope_theta,
    )
    if post:
        model.output_layer = layers.OutputLayer(tc, cfg.hidden_size, cfg.vocab_size, cfg.tie_word_embeddings, pre)
    model.share_embeddings_and_output_weights = cfg.tie_word_embeddings
    return model.to(device)
