"""How a run stops early: its exceptions, below everything that raises them (no import circle)."""

from __future__ import annotations


class ActorFailed(RuntimeError):
    """A Ray actor died or raised; `actor` names it ("trainer rank 0", "rollout engine 1")."""

    def __init__(self, message: str, actor: str, died: bool, index: int):
        super().__init__(message)
        self.actor, self.died, self.index = actor, died, index


class RunStopped(RuntimeError):
    """The run stopped before its last step; the message says why and how to resume."""

    def __init__(self, message: str, exit_code: int = 1):
        super().__init__(message)
        self.exit_code = exit_code
