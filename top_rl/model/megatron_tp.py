"""One rank's tensor-parallel slice of a full Megatron (local spec) tensor, and back: exactly invertible
(values are only moved). The model family maps HF names onto Megatron's (top_rl/model/<family>/hf_names.py).
  column-parallel (dim 0): linear_qkv (whole query groups per rank), linear_fc1, embedding, output_layer
  row-parallel (dim 1): linear_proj, linear_fc2;  replicated: every norm (q/k norms included)
  linear_fc1 is [gate; up]: a TP rank holds [gate shard; up shard], not a chunk of the concatenation
(docs/megatron.md §7)
"""

from __future__ import annotations

import torch

from top_rl.model.megatron_names import global_name, layer_of, local_name  # noqa: F401  (the trainer's names)

_COLUMN = ("self_attention.linear_qkv.weight", "mlp.linear_fc1.weight", "word_embeddings.weight",
           "output_layer.weight")
_ROW = ("self_attention.linear_proj.weight", "mlp.linear_fc2.weight")

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
