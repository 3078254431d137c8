"""Hydra's composed DictConfig -> the typed RunConfig, refusing a key the schema has no field for."""

from __future__ import annotations

import dataclasses

from omegaconf import OmegaConf

from top_rl.config.run import RunConfig


class ConfigError(ValueError):
    exit_code = 2  # `top-rl` exits 2 on a config it cannot use, as Hydra does on one it cannot compose


def _dropped_keys(node, obj, prefix: str = ""):
    """Keys of the composed config that its typed result has no field for. `+key=value` adds a key Hydra's
    schema does not have (its own error for `key=value` suggests the `+`), and OmegaConf.to_object drops it
    silently: such a key would change nothing."""
    from omegaconf import DictConfig

    for key in node.keys():
        child = node._get_node(key)
        if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
            if key not in {f.name for f in dataclasses.fields(obj)}:
                yield f"{prefix}{key}"
            elif isinstance(child, DictConfig):
                yield from _dropped_keys(child, getattr(obj, key), f"{prefix}{key}.")


def from_hydra(dict_cfg) -> RunConfig:
    """DictConfig composed by Hydra (schema: RunConfig) -> RunConfig, every key typed. Its values are checked once,
    by the run's preflight (top_rl.preflight.config_values calls top_rl.config_checks.validate), so a config changed
    after composing is checked too."""
    obj = OmegaConf.to_object(dict_cfg)
    dropped = list(_dropped_keys(dict_cfg, obj))
    if dropped:
        raise ConfigError(f"invalid config: {', '.join(dropped)} {'is not a key' if len(dropped) == 1 else 'are not keys'}"
                          " of the config (`top-rl --help` lists them): remove or correct it")
    return obj
