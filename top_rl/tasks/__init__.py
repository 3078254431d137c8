"""Tasks: prompt streams with a tokenizer and a reward. ``get_task(name, cfg)`` builds one.

Other packages add tasks through the entry-point group ``top_rl.tasks``: each entry names a Task subclass whose
``config_class`` attribute is its config dataclass (a TaskConfig subclass whose ``name`` defaults to the entry's
name); `top-rl task=NAME task.KEY=...` then runs it with no yaml and no edit here (docs/tasks.md)."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from top_rl.tasks.arith import ArithConfig, ArithTask
from top_rl.tasks.base import DataPosition, PromptItem, Task, TaskConfig
from top_rl.tasks.custom import CustomConfig, CustomTask
from top_rl.tasks.dapo import DapoConfig, DapoTask
from top_rl.tasks.gsm8k import Gsm8kConfig, Gsm8kTask

# name -> (config dataclass, constructor). New tasks register here.
TASKS: dict[str, tuple[type, Callable[..., Task]]] = {
    "arith": (ArithConfig, ArithTask),
    "gsm8k": (Gsm8kConfig, Gsm8kTask),
    "dapo": (DapoConfig, DapoTask),
    "custom": (CustomConfig, CustomTask),
}
ENTRY_POINT_GROUP = "top_rl.tasks"
_plugins_loaded = False


def load_plugin_tasks() -> dict[str, tuple[type, Callable[..., Task]]]:
    """Add the tasks other packages register under ENTRY_POINT_GROUP to TASKS (once); a broken entry is a
    ValueError naming it and its package. A name the package already has is refused, never replaced."""
    global _plugins_loaded
    if _plugins_loaded:
        return TASKS
    from importlib.metadata import entry_points

    for ep in entry_points(group=ENTRY_POINT_GROUP):
        where = f"entry point {ep.name!r} = {ep.value!r} (group {ENTRY_POINT_GROUP}" + \
            (f", package {ep.dist.name})" if ep.dist is not None else ")")
        if ep.name in TASKS:
            raise ValueError(f"{where}: top-rl already has a task {ep.name!r}; register it under another name")
        try:
            cls = ep.load()
        except Exception as e:
            raise ValueError(f"{where} cannot be loaded: {type(e).__name__}: {e}") from None
        cfg_cls = getattr(cls, "config_class", None)
        if not (isinstance(cls, type) and issubclass(cls, Task)) or not (
                isinstance(cfg_cls, type) and issubclass(cfg_cls, TaskConfig) and dataclasses.is_dataclass(cfg_cls)):
            raise ValueError(f"{where} must name a top_rl.tasks.Task subclass with a `config_class` attribute (a "
                             "dataclass extending top_rl.tasks.TaskConfig)")
        if cfg_cls().name != ep.name:
            raise ValueError(f"{where}: {cfg_cls.__name__}.name defaults to {cfg_cls().name!r}; it must be "
                             f"{ep.name!r}, the entry's name")
        TASKS[ep.name] = (cfg_cls, cls)
    _plugins_loaded = True
    return TASKS


def get_task(name: str, cfg: Any = None, **kwargs: Any) -> Task:
    """Build task ``name``. ``cfg`` is its config dataclass, or a mapping (dict / OmegaConf
    DictConfig from Hydra) whose keys are that dataclass's fields; ``kwargs`` go to the
    constructor (e.g. ``tokenizer=`` for gsm8k)."""
    cfg = task_config(name, cfg)
    return load_plugin_tasks()[name][1](cfg, **kwargs)


def task_config(name: str, cfg: Any = None) -> Any:
    """Task ``name``'s config dataclass from ``cfg`` (see get_task), its values checked (TaskConfig.errors); reads no
    data."""
    if name not in load_plugin_tasks():
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
           "ArithConfig", "ArithTask", "Gsm8kConfig", "Gsm8kTask", "CustomConfig", "CustomTask", "load_plugin_tasks"]
