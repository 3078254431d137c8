"""Qwen3's Hugging Face tensor names, and how they map onto the native model's fused layout and onto
Megatron's (local spec) names and layouts. Values are only moved, never rounded: every map is exactly
invertible. Megatron layouts (docs/megatron.md §7):
  linear_qkv  rows grouped per query group g: [q heads of g; k_g; v_g] (SGLang/HF keep [all q; all k; all v])
  linear_fc1  [gate; up]; a TP rank holds [gate shard; up shard] (top_rl.model.megatron_tp.shard)
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import torch

from top_rl.model.qwen3.config import NotDenseQwen3, Qwen3Config
from top_rl.model.megatron_names import LAYER, layer_of


# ------------------------------------------------------------------------------ native (engine) layout
def hf_state_dict(model) -> dict[str, torch.Tensor]:
    """Our parameters under Hugging Face names, fused projections split (values unchanged)."""
    cfg = model.cfg
    out = {"model.embed_tokens.weight": model.embed_tokens, "model.norm.weight": model.norm}
    if model.lm_head is not None:
        out["lm_head.weight"] = model.lm_head
    for i, layer in enumerate(model.layers):
        p = f"model.layers.{i}."
        q, k, v = layer.qkv_proj.split([cfg.q_size, cfg.kv_size, cfg.kv_size])
        gate, up = layer.gate_up_proj.chunk(2)
        out.update(
            {
                p + "input_layernorm.weight": layer.input_layernorm,
                p + "post_attention_layernorm.weight": layer.post_attention_layernorm,
                p + "self_attn.q_proj.weight": q,
                p + "self_attn.k_proj.weight": k,
                p + "self_attn.v_proj.weight": v,
                p + "self_attn.o_proj.weight": layer.o_proj,
                p + "self_attn.q_norm.weight": layer.q_norm,
                p + "self_attn.k_norm.weight": layer.k_norm,
                p + "mlp.gate_proj.weight": gate,
                p + "mlp.up_proj.weight": up,
                p + "mlp.down_proj.weight": layer.down_proj,
            }
        )
    return {k: v.detach().contiguous() for k, v in out.items()}


@torch.no_grad()
def load_hf_state_dict(model, sd: dict[str, torch.Tensor], source: str = "checkpoint") -> None:
    """Copy HF-named tensors into the model; each parameter keeps its contract dtype (fp32 norms and
    embedding hold the sent values exactly, linears round to the compute dtype, as SGLang's copy_ does)."""

    def take(name):
        try:
            return sd[name]
        except KeyError:
            raise NotDenseQwen3(f"{source} lacks tensor {name!r}: not a Qwen3 checkpoint matching its config") from None

    def put(param, value, name):
        if tuple(value.shape) != tuple(param.shape):
            raise NotDenseQwen3(f"{source}: {name} has shape {tuple(value.shape)}, config implies {tuple(param.shape)}")
        param.copy_(value)

    put(model.embed_tokens, take("model.embed_tokens.weight"), "model.embed_tokens.weight")
    put(model.norm, take("model.norm.weight"), "model.norm.weight")
    if model.lm_head is not None:
        put(model.lm_head, take("lm_head.weight"), "lm_head.weight")
    for i, layer in enumerate(model.layers):
        p = f"model.layers.{i}."
        qkv = torch.cat([take(p + f"self_attn.{x}_proj.weight") for x in "qkv"])
        gate_up = torch.cat([take(p + "mlp.gate_proj.weight"), take(p + "mlp.up_proj.weight")])
        for param, value, name in (
            (layer.input_layernorm, take(p + "input_layernorm.weight"), p + "input_layernorm.weight"),
            (layer.post_attention_layernorm, take(p + "post_attention_layernorm.weight"), p + "post_attention_layernorm"),
            (layer.qkv_proj, qkv, p + "self_attn.qkv"),
            (layer.o_proj, take(p + "self_attn.o_proj.weight"), p + "self_attn.o_proj.weight"),
            (layer.q_norm, take(p + "self_attn.q_norm.weight"), p + "self_attn.q_norm.weight"),
            (layer.k_norm, take(p + "self_attn.k_norm.weight"), p + "self_attn.k_norm.weight"),
            (layer.gate_up_proj, gate_up, p + "mlp.gate_up"),
            (layer.down_proj, take(p + "mlp.down_proj.weight"), p + "mlp.down_proj.weight"),
        ):
            put(param, value, name)



# ------------------------------------------------------------------------------ Megatron layout
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
def megatron_names(cfg: Qwen3Config) -> list[str]:
    """Every full-model Megatron parameter name, global layer indices, in a fixed order."""
    names = ["embedding.word_embeddings.weight"]
    for i in range(cfg.num_hidden_layers):
        p = LAYER.format(i)
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
        p, hp = LAYER.format(i), _HF_LAYER.format(i)
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
