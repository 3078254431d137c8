"""Hugging Face Qwen3 checkpoints <-> our fused layout: config.json + safetensors (single or sharded)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from top_rl.model.config import NotDenseQwen3, Qwen3Config
from top_rl.model.qwen3 import Qwen3

_INDEX = "model.safetensors.index.json"


def hf_state_dict(model: Qwen3) -> dict[str, torch.Tensor]:
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
def load_hf_state_dict(model: Qwen3, sd: dict[str, torch.Tensor], source: str = "checkpoint") -> None:
    """Copy HF-named tensors into the model; each parameter keeps its contract dtype (fp32 norms and
    embedding hold the sent values exactly, linears round to the compute dtype, as SGLang's copy_ does)."""
    cfg = model.cfg

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


def read_safetensors(path: str | Path) -> dict[str, torch.Tensor]:
    path = Path(path)
    if (path / _INDEX).is_file():
        index = json.loads((path / _INDEX).read_text())
        sd = {}
        for shard in sorted(set(index["weight_map"].values())):
            sd.update(load_file(path / shard))
        return sd
    single = path / "model.safetensors"
    if not single.is_file():
        raise NotDenseQwen3(f"{path} has neither model.safetensors nor {_INDEX}")
    return load_file(single)


def load_model(path: str | Path, dtype: torch.dtype | str | None = None) -> Qwen3:
    cfg = Qwen3Config.from_dir(path)
    model = Qwen3(cfg, dtype)
    load_hf_state_dict(model, read_safetensors(path), source=str(path))
    return model


def save_model(model: Qwen3, path: str | Path, max_shard_bytes: int | None = None) -> None:
    """Write config.json and safetensors (sharded with an index when over max_shard_bytes); files are
    written under temporary names and renamed, so a reader never sees a half-written checkpoint."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    sd = hf_state_dict(model)
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, t in sd.items():
        nbytes = t.numel() * t.element_size()
        if max_shard_bytes and shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = t
        size += nbytes
    meta = {"format": "pt"}
    if len(shards) == 1:
        _atomic(path / "model.safetensors", lambda p: save_file(shards[0], p, metadata=meta))
    else:
        weight_map, total = {}, 0
        for i, shard in enumerate(shards):
            fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
            _atomic(path / fname, lambda p, s=shard: save_file(s, p, metadata=meta))
            weight_map.update({k: fname for k in shard})
            total += sum(t.numel() * t.element_size() for t in shard.values())
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        _atomic(path / _INDEX, lambda p: Path(p).write_text(json.dumps(index, indent=2)))
    hf_cfg = model.cfg.replace(torch_dtype=str(model.policy.compute).replace("torch.", "")).to_hf_dict()
    _atomic(path / "config.json", lambda p: Path(p).write_text(json.dumps(hf_cfg, indent=2)))


def _atomic(final: Path, write) -> None:
    tmp = final.with_name(final.name + ".tmp")
    write(str(tmp))
    os.replace(tmp, final)
