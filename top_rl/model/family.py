"""Model families: everything that knows one architecture (its config, HF tensor names, native model) lives in
one package, top_rl/model/<family>/, and its Megatron layer spec in the trainer (top_rl/train/trainer.py
MEGATRON_SPECS); the rest of TOP-RL reaches it through this registry. A family package exposes:
  NAME, Config (frozen dataclass: from_hf_dict / from_dir / to_hf_dict, `family` = NAME), NotSupported,
  shape_errors(cfg, prefix)       why a shape (a Config, or a run's model.* fields) is not one of the family's
  NativeModel(config, dtype)      the engine's model over the kernel seam (.load_hf, .hf_state_dict,
                                  .new_kv_cache, .init_random)
  hf_to_megatron, iter_megatron_to_hf, megatron_names, full_shape   HF <-> Megatron names and layouts
  serves(model_type)              whether a config.json's model_type is this family's
Adding a size of a family is config; adding a family is one new package, one line below and its Megatron spec.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from types import ModuleType

from top_rl.config.model import ModelConfig

FAMILIES = {"qwen3": "top_rl.model.qwen3"}  # family name -> its package
DEFAULT = ModelConfig.family  # the run config's model.family


class UnsupportedModel(ValueError):
    """A checkpoint or config no family (or not the chosen one) can serve under a TOP contract."""


def get(name: str) -> ModuleType:
    if name not in FAMILIES:
        raise UnsupportedModel(f"model family {name!r} is not one TOP-RL serves ({', '.join(FAMILIES)})")
    return importlib.import_module(FAMILIES[name])


def of(config) -> ModuleType:
    """The family of a model config object."""
    return get(config.family)


def read_config_json(path: str | Path) -> dict:
    """The checkpoint's config.json as a dict; an unreadable or malformed file is an UnsupportedModel naming it."""
    f = Path(path) / "config.json"
    if not f.is_file():
        raise UnsupportedModel(f"{path} has no config.json: not a Hugging Face model directory")
    try:
        d = json.loads(f.read_bytes().decode("utf-8"))
    except (OSError, UnicodeDecodeError) as e:
        raise UnsupportedModel(f"{f} cannot be read ({e})") from None
    except json.JSONDecodeError as e:
        raise UnsupportedModel(f"{f}:{e.lineno}: not valid JSON ({e.msg})") from None
    if not isinstance(d, dict):
        raise UnsupportedModel(f"{f} holds a JSON {type(d).__name__}, not a model config object")
    return d


def config_from_dir(path: str | Path):
    """The config of the HF checkpoint at `path`, read by the family its config.json names."""
    model_type = read_config_json(path).get("model_type")
    served = [get(name) for name in FAMILIES if get(name).serves(model_type)]
    # No family serves it: the default family's reader refuses it, saying what it needs and what it found.
    return (served[0] if served else get(DEFAULT)).Config.from_dir(path)
