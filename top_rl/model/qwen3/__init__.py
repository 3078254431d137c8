"""Dense Qwen3, the model family TOP-RL serves (contract qwen3_dense_top_v1): everything that knows Qwen3
lives in this package (top_rl/model/family.py lists what a family exposes), except its Megatron layer
spec, which is the trainer's (top_rl/train/qwen3_megatron.py).
  config.py     Qwen3Config: HF config.json <-> the dataclass, with the contract's refusals (shape_errors)
  native.py     the native model over the kernel seam (the engine's, and the reference the trainer equals)
  hf_names.py   HF tensor names <-> native fused layout and <-> Megatron names/layouts
"""

from __future__ import annotations

from top_rl.model.qwen3.config import NotDenseQwen3 as NotSupported, Qwen3Config as Config, shape_errors

NAME = "qwen3"
__all__ = ["NAME", "Config", "NotSupported", "shape_errors", "NativeModel", "full_shape", "hf_to_megatron", "iter_megatron_to_hf",
           "megatron_names", "serves"]


_HF_NAMES = ("full_shape", "hf_to_megatron", "iter_megatron_to_hf", "megatron_names")


def __getattr__(name: str):
    # The model and its tensor names need torch; the config does not (the run config reads its defaults).
    if name == "NativeModel":
        from top_rl.model.qwen3.native import Qwen3

        return Qwen3
    if name in _HF_NAMES:
        from top_rl.model.qwen3 import hf_names

        return getattr(hf_names, name)
    raise AttributeError(f"module 'top_rl.model.qwen3' has no attribute {name!r}")


def serves(model_type: str | None) -> bool:
    return model_type == "qwen3"
