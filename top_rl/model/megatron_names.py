"""Megatron's parameter names (GPTModel, local spec), for any model family: full-model names carry global
layer indices; a pipeline stage's own parameters carry local ones."""

from __future__ import annotations

LAYER = "decoder.layers.{}."


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
    return LAYER.format(i - offset) + suffix


def global_name(local: str, offset: int) -> str:
    if not local.startswith("decoder.layers."):
        return local
    i, suffix = layer_of(local)
    return LAYER.format(i + offset) + suffix


