"""The run config's task section's base (plain data: the run config's schema imports it without any task)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class TaskConfig:
    """The run config's task section. Each task's config dataclass extends it (top_rl.tasks.TASKS) and Hydra's task
    group picks which. `errors()` states the value rules its types cannot (string choices, ranges), each message
    naming its task.* key: config_checks.validate asks it for a run, tasks.task_config for a task built directly; the task
    constructors check none of them."""

    name: str = ""  # a key of top_rl.tasks.TASKS

    def errors(self) -> list[str]:
        return []


def choice_errors(key: str, value: Any, allowed: tuple[str, ...]) -> list[str]:
    """`task.<key>`'s string choice, as config_checks.validate words it."""
    return [] if value in allowed else [f"task.{key}={value!r}; choose one of: {', '.join(allowed)}"]
