"""The trainer layouts (trainer.tp / pp / cp) a model allows, checked before Ray starts (top_rl.preflight) with the
rules Megatron-core and the TOP layers would otherwise enforce on every rank, as stack traces, after Ray started:

  tp  divides num_attention_heads and num_key_value_heads (Megatron; KV heads are never replicated here),
      intermediate_size (the MLP's column and row splits) and the vocabulary (vocab-parallel embedding and LM
      head, unpadded). With the reference kernels, each rank's share of a row-parallel GEMM's K (num_attention_heads
      x head_dim / tp, intermediate_size / tp) is a multiple of the contract's k_chunk (the TP-invariant sum).
  pp  divides num_hidden_layers (Megatron's even split).
  cp  divides each TP rank's query heads and KV heads (Ulysses hands whole heads to each CP rank).

Importable without torch or Megatron (the driver and dry runs use it).
"""

from __future__ import annotations

from dataclasses import dataclass


class LayoutError(ValueError):
    """A trainer layout the model cannot be split into; the message names the keys and the valid values."""


@dataclass(frozen=True)
class ModelShape:
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    num_hidden_layers: int
    vocab_size: int | None = None  # None: not known yet (a random model takes its task tokenizer's)

    @classmethod
    def of(cls, cfg, vocab_size: int | None = None) -> "ModelShape":
        """From a model family's Config or the run's ModelConfig (same field names)."""
        return cls(cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.intermediate_size,
                   cfg.num_hidden_layers, getattr(cfg, "vocab_size", vocab_size) or vocab_size)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def tp_problems(shape: ModelShape, tp: int, k_chunk: int | None) -> list[str]:
    """Why `tp` does not split this model (empty: it does). `k_chunk`: the contract's, when the kernels need it."""
    sizes = {"num_attention_heads": shape.num_attention_heads, "num_key_value_heads": shape.num_key_value_heads,
             "intermediate_size": shape.intermediate_size, "vocab_size": shape.vocab_size}
    bad = [f"{k} ({v})" for k, v in sizes.items() if v is not None and v % tp]
    out = [f"{' and '.join(bad)} must be {'multiples' if len(bad) > 1 else 'a multiple'} of trainer.tp"] if bad else []
    if k_chunk and tp > 1 and not bad:
        shards = {"num_attention_heads x head_dim / tp": shape.num_attention_heads * shape.head_dim // tp,
                  "intermediate_size / tp": shape.intermediate_size // tp}
        short = [f"{k} = {v}" for k, v in shards.items() if v % k_chunk]
        if short:
            out.append(f"with top.kernels=reference each rank's share of a row-parallel GEMM's K ({', '.join(short)}) "
                       f"must be a multiple of the contract's k_chunk ({k_chunk})")
    return out


def valid_tp(shape: ModelShape, k_chunk: int | None) -> list[int]:
    return [t for t in _divisors(shape.num_attention_heads) if not tp_problems(shape, t, k_chunk)]


def valid_cp(shape: ModelShape, tp: int) -> list[int]:
    q, kv = shape.num_attention_heads // tp, shape.num_key_value_heads // tp
    return [c for c in _divisors(kv) if q % c == 0]


def _values(values: list[int]) -> str:
    return ", ".join(map(str, values))


def problems(shape: ModelShape, tp: int, pp: int, cp: int, k_chunk: int | None) -> list[str]:
    """One sentence per key that does not fit, each naming the valid values."""
    out = []
    tp_bad = tp_problems(shape, tp, k_chunk)
    if tp_bad:
        out.append(f"trainer.tp={tp} does not split this model: {'; '.join(tp_bad)}; valid trainer.tp: "
                   f"{_values(valid_tp(shape, k_chunk))}")
    if shape.num_hidden_layers % pp:
        out.append(f"trainer.pp={pp} does not split this model: num_hidden_layers ({shape.num_hidden_layers}) must "
                   f"be a multiple of trainer.pp; valid trainer.pp: {_values(_divisors(shape.num_hidden_layers))}")
    if not tp_bad and cp not in valid_cp(shape, tp):
        out.append(f"trainer.cp={cp} does not split this model at trainer.tp={tp}: each TP rank's query heads "
                   f"({shape.num_attention_heads // tp}) and KV heads ({shape.num_key_value_heads // tp}) must be "
                   f"multiples of trainer.cp (Ulysses); valid trainer.cp: {_values(valid_cp(shape, tp))}")
    return out


def check(shape: ModelShape, tp: int, pp: int, cp: int, k_chunk: int | None) -> None:
    found = problems(shape, tp, pp, cp, k_chunk)
    if found:
        raise LayoutError(". ".join(found))


def hint(shape: ModelShape, k_chunk: int | None) -> str:
    """What this model allows, for messages that suggest changing the layout."""
    return (f"this model allows trainer.tp {_values(valid_tp(shape, k_chunk))} and trainer.pp "
            f"{_values(_divisors(shape.num_hidden_layers))}")
