"""Dense Qwen3 configuration, read from and written to a Hugging Face `config.json`."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from top_rl.model.family import UnsupportedModel, read_config_json


class NotDenseQwen3(UnsupportedModel):
    """A checkpoint or config this project cannot serve: TOP covers dense Qwen3 only."""


# Every size the model allocates a tensor by: a zero or negative one passes a layout check and fails in an actor,
# after Ray started. vocab_size is absent from a run's model.* fields (a random model takes its tokenizer's).
SIZES = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
         "num_key_value_heads", "head_dim", "max_position_embeddings")


def shape_errors(cfg, prefix: str = "") -> list[str]:
    """Why this shape is no dense Qwen3 (empty: it is one), each reason naming its field (`prefix` + name). `cfg`: a
    Qwen3Config or a run's model.* fields (top_rl.config.model.ModelConfig: the same names). Qwen3's attention maps hidden_size to
    num_attention_heads x head_dim and back (Qwen3-0.6B: 1024 -> 16 x 128), so the heads need not divide
    hidden_size; the query heads are grouped over the KV heads, and NeoX RoPE rotates head_dim in halves."""
    sizes = {k: getattr(cfg, k) for k in SIZES if hasattr(cfg, k)}
    bad = [f"{prefix}{k}={v!r} must be a positive integer" for k, v in sizes.items()
           if isinstance(v, bool) or not isinstance(v, int) or v < 1]
    if bad:  # the rules below would only repeat them
        return bad
    errors = []
    if cfg.num_attention_heads % cfg.num_key_value_heads:
        errors.append(f"{prefix}num_attention_heads={cfg.num_attention_heads} is not a multiple of "
                      f"{prefix}num_key_value_heads={cfg.num_key_value_heads} (each KV head serves a whole group of "
                      "query heads)")
    if cfg.head_dim % 2:
        errors.append(f"{prefix}head_dim={cfg.head_dim} must be even for NeoX RoPE")
    theta = cfg.rope_theta
    if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not theta > 0:
        errors.append(f"{prefix}rope_theta={theta!r} must be > 0 (RoPE's frequencies are its powers)")
    return errors


@dataclass(frozen=True)
class Qwen3Config:
    family: ClassVar[str] = "qwen3"
    vocab_size: int = 64
    hidden_size: int = 64
    intermediate_size: int = 128
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 16
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    max_position_embeddings: int = 512
    tie_word_embeddings: bool = True
    torch_dtype: str = "bfloat16"
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    pad_token_id: int | None = None

    def __post_init__(self):
        errors = shape_errors(self)
        if errors:
            raise NotDenseQwen3("; ".join(errors))

    @property
    def q_size(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_key_value_heads * self.head_dim

    def replace(self, **kw) -> "Qwen3Config":
        return dataclasses.replace(self, **kw)

    def to_hf_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d.update(
            architectures=["Qwen3ForCausalLM"],
            model_type="qwen3",
            hidden_act="silu",
            attention_bias=False,
            attention_dropout=0.0,
            rope_scaling=None,
            use_sliding_window=False,
            dtype=self.torch_dtype,
        )
        return {k: v for k, v in d.items() if v is not None or k == "rope_scaling"}

    @classmethod
    def from_hf_dict(cls, d: dict, source: str = "config") -> "Qwen3Config":
        model_type = d.get("model_type")
        archs = d.get("architectures") or ["Qwen3ForCausalLM"]
        if model_type != "qwen3" or "Qwen3ForCausalLM" not in archs:
            raise NotDenseQwen3(
                f"{source} is not a dense Qwen3 checkpoint (model_type={model_type!r}, architectures={archs}); "
                "TOP-RL's contract qwen3_dense_top_v1 covers Qwen3ForCausalLM only"
            )
        for key, ok in (("attention_bias", False), ("use_sliding_window", False)):
            if d.get(key, ok) != ok:
                raise NotDenseQwen3(f"{source}: {key}={d[key]!r} is outside the TOP contract (needs {ok})")
        scaling = d.get("rope_scaling") or d.get("rope_parameters")
        if scaling and scaling.get("rope_type", scaling.get("type", "default")) != "default":
            raise NotDenseQwen3(f"{source}: rope scaling {scaling} is outside the TOP contract (default RoPE only)")
        theta = d.get("rope_theta") or (scaling or {}).get("rope_theta", 1_000_000.0)
        heads = d["num_attention_heads"]
        head_dim = d.get("head_dim")
        if not head_dim and isinstance(heads, int) and heads > 0 and isinstance(d["hidden_size"], int):
            head_dim = d["hidden_size"] // heads  # HF's default; shape_errors names a bad heads or hidden_size
        dtype = d.get("torch_dtype") or d.get("dtype") or "bfloat16"
        eos = d.get("eos_token_id")
        try:
            return cls(
                vocab_size=d["vocab_size"],
                hidden_size=d["hidden_size"],
                intermediate_size=d["intermediate_size"],
                num_hidden_layers=d["num_hidden_layers"],
                num_attention_heads=heads,
                num_key_value_heads=d.get("num_key_value_heads", heads),
                head_dim=head_dim,
                rms_norm_eps=d.get("rms_norm_eps", 1e-6),
                rope_theta=float(theta) if isinstance(theta, (int, float)) else theta,
                max_position_embeddings=d.get("max_position_embeddings", 40960),
                tie_word_embeddings=d.get("tie_word_embeddings", False),
                torch_dtype=str(dtype).replace("torch.", ""),
                bos_token_id=d.get("bos_token_id"),
                eos_token_id=eos[0] if isinstance(eos, list) else eos,
                pad_token_id=d.get("pad_token_id"),
            )
        except NotDenseQwen3 as e:  # its sizes: named with the file they came from
            raise NotDenseQwen3(f"{source}: {e}") from None

    @classmethod
    def from_dir(cls, path: str | Path) -> "Qwen3Config":
        source = str(Path(path) / "config.json")
        d = read_config_json(path)
        try:
            return cls.from_hf_dict(d, source=source)
        except KeyError as e:
            raise NotDenseQwen3(f"{source} has no {e.args[0]!r}: not a complete Qwen3 config") from None
