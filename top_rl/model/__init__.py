"""Models over the kernel seam, by family (top_rl/model/family.py; today one: dense Qwen3, top_rl/model/qwen3),
with Hugging Face checkpoint I/O (hf_io.py) and packed scoring (packing.py). Imported lazily: a plain module here
(family.py, source.py) loads no torch through the others."""

import importlib

_EXPORTS = {
    "family": None, "UnsupportedModel": "family",
    "hf_state_dict": "qwen3.hf_names", "load_hf_state_dict": "qwen3.hf_names",
    "read_safetensors": "hf_io", "load_model": "hf_io", "save_model": "hf_io", "write_hf": "hf_io",
    "pack": "packing", "packed_positions": "packing", "sequence_logprobs": "packing",
    # the default family's classes under their own names, for users and tests
    "Qwen3": ("qwen3.native", "Qwen3"), "KVCache": "qwen3.native",
    "Qwen3Config": ("qwen3.config", "Qwen3Config"), "NotDenseQwen3": "qwen3.config",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'top_rl.model' has no attribute {name!r}")
    where = _EXPORTS[name]
    if where is None:
        return importlib.import_module(f"top_rl.model.{name}")
    module, attr = where if isinstance(where, tuple) else (where, name)
    return getattr(importlib.import_module(f"top_rl.model.{module}"), attr)
