"""Tasks: prompt streams with a tokenizer and a reward. ``get_task(name, cfg)`` builds one."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from top_rl.tasks.arith import ArithConfig, ArithTask
from top_rl.tasks.base import DataPosition, PromptItem, Task, TaskConfig
from top_rl.tasks.dapo import DapoConfig, DapoTask
from top_rl.tasks.gsm8k import Gsm8kConfig, Gsm8kTask

# name -> (config dataclass, constructor). New tasks register here.
TASKS: dict[str, tuple[type, Callable[..., Task]]] = {
    "arith": (ArithConfig, ArithTask),
    "gsm8k": (Gsm8kConfig, Gsm8kTask),
    "dapo": (DapoConfig, DapoTask),
}


def get_task(name: str, cfg: Any = None, **kwargs: Any) -> Task:
    """Build task ``name``. ``cfg`` is its config dataclass, or a mapping (dict / OmegaConf
    DictConfig from Hydra) whose keys are that dataclass's fields; ``kwargs`` go to the
    constructor (e.g. ``tokenizer=`` for gsm8k)."""
    cfg = task_config(name, cfg)
    return TASKS[name][1](cfg, **kwargs)


def task_config(name: str, cfg: Any = None) -> Any:
    """Task ``name``'s config dataclass from ``cfg`` (see get_task), its values checked (TaskConfig.errors); reads no
    data."""
    if name not in TASKS:
        raise KeyError(f"unknown task {name!r}; known: {sorted(TASKS)}")
    cfg_cls, _ = TASKS[name]
    if cfg is None:
        cfg = cfg_cls()
    elif not isinstance(cfg, cfg_cls):
        if dataclasses.is_dataclass(cfg):
            cfg = dataclasses.asdict(cfg)
        elif not isinstance(cfg, dict):
            from omegaconf import OmegaConf  # a Hydra DictConfig
            cfg = OmegaConf.to_container(cfg, resolve=True)
        fields = {f.name for f in dataclasses.fields(cfg_cls)}
        unknown = set(cfg) - fields
        if unknown:
            raise ValueError(f"task {name!r}: unknown config keys {sorted(unknown)}; known {sorted(fields)}")
        cfg = cfg_cls(**cfg)
    errors = cfg.errors()
    if errors:
        raise ValueError("; ".join(errors))
    return cfg


__all__ = ["get_task", "task_config", "TASKS", "Task", "TaskConfig", "PromptItem", "DataPosition",
           "ArithConfig", "ArithTask", "Gsm8kConfig", "Gsm8kTask"]
