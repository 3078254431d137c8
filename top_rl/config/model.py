"""The run config's model section: where a run's model comes from, a Hugging Face checkpoint or a random model of
`model.family` built from the shape fields below (plain data: top_rl/model/source.py builds it; sizes are config,
families: top_rl/model/family.py), and its compute dtype."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class ComputeDtype(StrEnum):
    """The model's compute dtype (embedding, norms and residual stream stay fp32: top_rl/dtypes.py)."""

    bfloat16 = "bfloat16"
    float32 = "float32"  # tests and the embedded CPU job


# The defaults are the embedded CPU job's model: a tiny random Qwen3 (vocab from the task's tokenizer), trainable from
# scratch on a laptop CPU. A real model's shape is a conf/model group (conf/model/qwen3_0.6b.yaml).
@dataclass
class ModelConfig:
    family: str = "qwen3"  # the architecture of a random model (a checkpoint's config.json names its own)
    path: str | None = None  # HF checkpoint dir; None builds a random model from the fields below
    dtype: ComputeDtype = ComputeDtype.float32  # embedding, norms, residual stay fp32 (contract)
    hidden_size: int = 64  # random model: width of the residual stream
    intermediate_size: int = 128  # random model: width of the MLP
    num_hidden_layers: int = 2  # random model: decoder layers
    num_attention_heads: int = 4  # random model: query heads
    num_key_value_heads: int = 2  # random model: key/value heads (GQA groups)
    head_dim: int = 16  # random model: size of one attention head
    max_position_embeddings: int = 64  # random model: longest sequence (prompt + response) in tokens
    tie_word_embeddings: bool = True  # random model: the LM head is the embedding
    rope_theta: float = 10000.0  # random model: RoPE base
    init_seed: int = 0  # seed of a random model's weights
    init_std: float = 0.02  # standard deviation of a random model's weights (>= 0)
