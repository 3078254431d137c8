"""Where a run's model comes from: a Hugging Face Qwen3 checkpoint, or a tiny Qwen3 built from config."""

from __future__ import annotations

from dataclasses import dataclass

from top_rl.model.config import Qwen3Config
from top_rl.model.hf_io import load_model
from top_rl.model.qwen3 import Qwen3


@dataclass
class ModelConfig:
    path: str | None = None  # HF Qwen3 checkpoint dir; None builds a random tiny Qwen3 from the fields below
    dtype: str = "bfloat16"  # compute dtype (contract: embedding, norms, residual stay fp32)
    hidden_size: int = 64
    intermediate_size: int = 128
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 16
    max_position_embeddings: int = 128
    tie_word_embeddings: bool = True
    rope_theta: float = 10000.0
    init_seed: int = 0
    init_std: float = 0.02

    def qwen3_config(self, vocab_size: int, eos_token_id: int | None) -> Qwen3Config:
        if self.path:
            return Qwen3Config.from_dir(self.path)
        return Qwen3Config(
            vocab_size=vocab_size, hidden_size=self.hidden_size, intermediate_size=self.intermediate_size,
            num_hidden_layers=self.num_hidden_layers, num_attention_heads=self.num_attention_heads,
            num_key_value_heads=self.num_key_value_heads, head_dim=self.head_dim,
            max_position_embeddings=self.max_position_embeddings, tie_word_embeddings=self.tie_word_embeddings,
            rope_theta=self.rope_theta, torch_dtype=self.dtype, eos_token_id=eos_token_id,
        )

    def build(self, vocab_size: int, eos_token_id: int | None) -> Qwen3:
        """The initial policy, built once per run; every engine and trainer rank receives its weights."""
        if self.path:
            return load_model(self.path, self.dtype)
        return Qwen3(self.qwen3_config(vocab_size, eos_token_id), self.dtype).init_random(self.init_seed, self.init_std)
