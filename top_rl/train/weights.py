"""Hugging Face Qwen3 <-> Megatron (local spec) weights: names, layouts and TP shards.

Three pure steps, each exactly invertible (values are only moved, never rounded):
  hf_to_megatron / megatron_to_hf   names and fused layouts, full tensors, global layer indices
  shard / unshard                   one rank's tensor-parallel slice of a full Megatron tensor
Layouts (shared/reference/megatron-core.md §7):
  linear_qkv  rows grouped per query group g: [q heads of g; k_g; v_g] (SGLang/HF keep [all q; all k; all v])
  linear_fc1  [gate; up]; a TP rank holds [gate shard; up shard], not a chunk of the concatenation
  column-parallel (dim 0): linear_qkv (whole query groups per rank), linear_fc1, embedding, output_layer
  row-parallel (dim 1): linear_proj, linear_fc2;  replicated: every norm (q/k norms included)
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import torch

from top_rl.model.config import NotDenseQwen3, Qwen3Config

_LAYER = "decoder.layers.{}."
_HF_LAYER = "model.layers.{}."
# Megatron suffix -> HF suffix for tensors that map one to one.
_DIRECT = {
    "input_layernorm.weight": "input_layernorm.weight",
    "self_attention.q_layernorm.weight": "self_attn.q_norm.weight",
    "self_attention.k_layernorm.weight": "self_attn.k_norm.weight",
    "self_attention.linear_proj.weight": "self_attn.o_proj.weight",
    "pre_mlp_layernorm.weight": "post_attention_layernorm.weight",
    "mlp.linear_fc2.weight": "mlp.down_proj.weight",
}
_COLUMN = ("self_attention.linear_qkv.weight", "mlp.linear_fc1.weight", "word_embeddings.weight",
           "output_layer.weight")
_ROW = ("self_attention.linear_proj.weight", "mlp.linear_fc2.weight")


def megatron_names(cfg: Qwen3Config) -> list[str]:
    """Every full-model Megatron parameter name, global layer indices, in a fixed order."""
    names = ["embedding.word_embeddings.weight"]
    for i in range(cfg.num_hidden_layers):
        p = _LAYER.format(i)
        names += [p + "input_layernorm.weight", p + "self_attention.linear_qkv.weight",
                  p + "self_attention.q_layernorm.weight", p + "self_attention.k_layernorm.weight",
                  p + "self_attention.linear_proj.weight", p + "pre_mlp_layernorm.weight",
                  p + "mlp.linear_fc1.weight", p + "mlp.linear_fc2.weight"]
    names.append("decoder.final_layernorm.weight")
    if not cfg.tie_word_embeddings:
        names.append("output_layer.weight")
    return names


def interleave_qkv(q, k, v, cfg: Qwen3Config) -> torch.Tensor:
    ng, d = cfg.num_key_value_heads, cfg.head_dim
    per = cfg.num_attention_heads // ng
    h = q.shape[-1]
    return torch.cat([q.reshape(ng, per * d, h), k.reshape(ng, d, h), v.reshape(ng, d, h)], 1).reshape(-1, h)


def split_qkv(qkv, cfg: Qwen3Config) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    ng, d = cfg.num_key_value_heads, cfg.head_dim
    per = cfg.num_attention_heads // ng
    h = qkv.shape[-1]
    q, k, v = qkv.reshape(ng, (per + 2) * d, h).split([per * d, d, d], dim=1)
    return q.reshape(-1, h), k.reshape(-1, h), v.reshape(-1, h)


def hf_to_megatron(hf: Mapping[str, torch.Tensor], cfg: Qwen3Config, source: str = "checkpoint") -> dict:
    def take(name):
        try:
            return hf[name]
        except KeyError:
            raise NotDenseQwen3(f"{source} lacks tensor {name!r}: not a Qwen3 checkpoint matching its config") from None

    out = {"embedding.word_embeddings.weight": take("model.embed_tokens.weight"),
           "decoder.final_layernorm.weight": take("model.norm.weight")}
    if not cfg.tie_word_embeddings:
        out["output_layer.weight"] = take("lm_head.weight")
    for i in range(cfg.num_hidden_layers):
        p, hp = _LAYER.format(i), _HF_LAYER.format(i)
        for m, h in _DIRECT.items():
            out[p + m] = take(hp + h)
        out[p + "self_attention.linear_qkv.weight"] = interleave_qkv(
            *(take(hp + f"self_attn.{x}_proj.weight") for x in "qkv"), cfg)
        out[p + "mlp.linear_fc1.weight"] = torch.cat([take(hp + "mlp.gate_proj.weight"), take(hp + "mlp.up_proj.weight")])
    return out


def megatron_to_hf(mg: Mapping[str, torch.Tensor], cfg: Qwen3Config) -> dict:
    return dict(iter_megatron_to_hf(mg.items(), cfg))


def iter_megatron_to_hf(items, cfg: Qwen3Config) -> Iterator[tuple[str, torch.Tensor]]:
    """(megatron name, full tensor) pairs -> (HF name, tensor) pairs, streaming."""
    for name, t in items:
        if name == "embedding.word_embeddings.weight":
            yield "model.embed_tokens.weight", t
        elif name == "decoder.final_layernorm.weight":
            yield "model.norm.weight", t
        elif name == "output_layer.weight":
            yield "lm_head.weight", t
        else:
            i, suffix = layer_of(name)
            hp = _HF_LAYER.format(i)
            if suffix in _DIRECT:
                yield hp + _DIRECT[suffix], t
            elif suffix == "self_attention.linear_qkv.weight":
                for x, part in zip("qkv", split_qkv(t, cfg)):
                    yield hp + f"self_attn.{x}_proj.weight", part
            elif suffix == "mlp.linear_fc1.weight":
                gate, up = t.chunk(2)
                yield hp + "mlp.gate_proj.weight", gate
                yield hp + "mlp.up_proj.weight", up
            else:
                raise KeyError(f"unknown Megatron parameter {name!r}")


def layer_of(name: str) -> tuple[int, str]:
    parts = name.split(".", 3)
    if parts[:2] != ["decoder", "layers"]:
        raise KeyError(f"unknown Megatron parameter {name!r}")
    return int(parts[2]), parts[3]


def local_name(global_name: str, offset: int) -> str:
    """decoder.layers.{i} with global i -> this pipeline stage's local index i - offset."""
    if not global_name.startswith("decoder.layers."):
        return global_name
    i, suffix = layer_of(global_name)
    return _LAYER.format(i - offset) + suffix


def global_name(local: str, offset: int) -> str:
    if not local.startswith("decoder.layers."):
        return local
    i, suffix = layer_of(local)
    return _LAYER.format(i + offset) + suffix


def tp_kind(name: str) -> str:
    """How a Megatron parameter is split over TP: "column" (dim 0), "row" (dim 1) or "replicated"."""
    if name.endswith(_ROW):
        return "row"
    if name.endswith(_COLUMN):
        return "column"
    return "replicated"


def shard(name: str, full: torch.Tensor, tp: int, rank: int) -> torch.Tensor:
    """This TP rank's slice of a full Megatron tensor (a view where possible)."""
    kind = tp_kind(name)
    if tp == 1 or kind == "replicated":
        return full
    if kind == "row":
        return full.chunk(tp, dim=1)[rank]
    if name.endswith("mlp.linear_fc1.weight"):
        gate, up = full.chunk(2)
        return torch.cat([gate.chunk(tp)[rank], up.chunk(tp)[rank]])
    return full.chunk(tp, dim=0)[rank]  # qkv rows are grouped per query group: a chunk is whole groups


def unshard(name: str, shards: list[torch.Tensor]) -> torch.Tensor:
    """Inverse of `shard` over all TP ranks' slices (replicated tensors: rank 0's)."""
    kind = tp_kind(name)
    if len(shards) == 1 or kind == "replicated":
        return shards[0]
    if kind == "row":
        return torch.cat(shards, dim=1)
    if name.endswith("mlp.linear_fc1.weight"):
        halves = [s.chunk(2) for s in shards]
        return torch.cat([torch.cat([g for g, _ in halves]), torch.cat([u for _, u in halves])])
    return torch.cat(shards, dim=0)


def full_shape(name: str, cfg: Qwen3Config) -> tuple[int, ...]:
    h, d = cfg.hidden_size, cfg.head_dim
    if name.endswith("layernorm.weight") and ("q_layernorm" in name or "k_layernorm" in name):
        return (d,)
    if name.endswith("layernorm.weight"):
        return (h,)
    if name.endswith("linear_qkv.weight"):
        return (cfg.q_size + 2 * cfg.kv_size, h)
    if name.endswith("linear_proj.weight"):
        return (h, cfg.q_size)
    if name.endswith("linear_fc1.weight"):
        return (2 * cfg.intermediate_size, h)
    if name.endswith("linear_fc2.weight"):
        return (h, cfg.intermediate_size)
    return (cfg.vocab_size, h)  # embedding, output layer
