"""A run's model built from its config section (top_rl/config/model.py's ModelConfig): the checkpoint at model.path
(its family read from config.json), or a random model of model.family from the section's shape fields."""

from __future__ import annotations

from top_rl.model import family as families


def arch_config(cfg, vocab_size: int, eos_token_id: int | None):
    """The model's architecture config (its family's Config) from a ModelConfig `cfg`; refuses what no TOP contract
    covers."""
    if cfg.path:
        return families.config_from_dir(cfg.path)
    return families.get(cfg.family).Config(
        vocab_size=vocab_size, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_hidden_layers, num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads, head_dim=cfg.head_dim,
        max_position_embeddings=cfg.max_position_embeddings, tie_word_embeddings=cfg.tie_word_embeddings,
        rope_theta=cfg.rope_theta, torch_dtype=cfg.dtype, eos_token_id=eos_token_id,
    )


def build(cfg, vocab_size: int, eos_token_id: int | None):
    """The initial policy as a native model from a ModelConfig `cfg`: the checkpoint, or the seeded random init (the
    same on every trainer rank, which builds it; the engines receive its weights from trainer rank 0)."""
    if cfg.path:
        from top_rl.model.hf_io import load_model

        return load_model(cfg.path, cfg.dtype)
    arch = arch_config(cfg, vocab_size, eos_token_id)
    return families.of(arch).NativeModel(arch, cfg.dtype).init_random(cfg.init_seed, cfg.init_std)
