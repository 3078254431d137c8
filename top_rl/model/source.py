"""Where a run's model comes from: a Hugging Face checkpoint (its family read from config.json), or a random
model of `model.family` built from the shape fields below (sizes are config; families: top_rl/model/family.py)."""

from __future__ import annotations

from dataclasses import dataclass

from top_rl.contract import ComputeDtype
from top_rl.model import family as families


# The defaults are the embedded CPU job's model: a tiny random Qwen3 (vocab from the task's tokenizer), trainable from
# scratch on a laptop CPU. A real model's shape is a conf/model group (conf/model/qwen3_0.6b.yaml).
@dataclass
class ModelConfig:
    family: str = families.DEFAULT  # the architecture of a random model (a checkpoint's config.json names its own)
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

    def arch_config(self, vocab_size: int, eos_token_id: int | None):
        """The model's architecture config (its family's Config); refuses what no TOP contract covers."""
        if self.path:
            return families.config_from_dir(self.path)
        return families.get(self.family).Config(
            vocab_size=vocab_size, hidden_size=self.hidden_size, intermediate_size=self.intermediate_size,
            num_hidden_layers=self.num_hidden_layers, num_attention_heads=self.num_attention_heads,
            num_key_value_heads=self.num_key_value_heads, head_dim=self.head_dim,
            max_position_embeddings=self.max_position_embeddings, tie_word_embeddings=self.tie_word_embeddings,
            rope_theta=self.rope_theta, torch_dtype=self.dtype, eos_token_id=eos_token_id,
        )

    def build(self, vocab_size: int, eos_token_id: int | None):
        """The initial policy as a native model: the checkpoint, or the seeded random init (the same on every
        trainer rank, which builds it; the engines receive its weights from trainer rank 0)."""
        if self.path:
            from top_rl.model.hf_io import load_model

            return load_model(self.path, self.dtype)
        arch = self.arch_config(vocab_size, eos_token_id)
        return families.of(arch).NativeModel(arch, self.dtype).init_random(self.init_seed, self.init_std)
