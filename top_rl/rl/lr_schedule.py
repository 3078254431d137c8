"""The learning-rate schedule: linear warm-up over `trainer.lr_warmup_steps` optimizer updates, then constant, linear or
cosine decay to `trainer.lr_min` at update `trainer.lr_decay_steps` (and the floor after it).

The lr is a pure function of the number of updates the optimizer has taken, a count every trainer checkpoint holds
(top_rl.train.trainer: `step`), so a resumed run sets exactly the lr the uninterrupted run set, bit for bit. The
trainer sets it into the optimizer's parameter groups before each update (top_rl.train.trainer.optimizer_step)."""

from __future__ import annotations

import math
from dataclasses import dataclass

SCHEDULES = ("constant", "linear", "cosine")


@dataclass(frozen=True)
class LrSchedule:
    lr: float  # the peak: trainer.lr
    schedule: str = "constant"
    warmup_steps: int = 0
    lr_min: float = 0.0  # the floor the decay ends at
    decay_steps: int = 1  # the update at which the decay reaches lr_min (warm-up included)

    @property
    def is_constant(self) -> bool:
        """True when every update runs at `lr` exactly: the optimizer's lr is then never touched (as before schedules
        existed, so such runs keep their numbers)."""
        return self.schedule == "constant" and self.warmup_steps == 0

    def lr_at(self, update: int) -> float:
        """The lr of optimizer update `update` (0-based: the number of updates taken before it)."""
        if update < self.warmup_steps:  # (k + 1) / warmup: the first update is not at lr 0, which would waste it
            return self.lr * (update + 1) / self.warmup_steps
        if self.schedule == "constant":
            return self.lr
        span = max(self.decay_steps - self.warmup_steps, 1)
        progress = min(max(update - self.warmup_steps, 0) / span, 1.0)
        shape = 1.0 - progress if self.schedule == "linear" else 0.5 * (1.0 + math.cos(math.pi * progress))
        return self.lr_min + (self.lr - self.lr_min) * shape


def of(trainer_cfg) -> LrSchedule:
    """The schedule a TrainerConfig's lr_* keys name (lr_decay_steps null, unresolved by a driver: 1)."""
    return LrSchedule(trainer_cfg.lr, trainer_cfg.lr_schedule, trainer_cfg.lr_warmup_steps, trainer_cfg.lr_min,
                      trainer_cfg.lr_decay_steps or 1)


def errors(schedule: str, warmup_steps: int, lr: float, lr_min: float, decay_steps: int | None) -> list[str]:
    """The trainer.lr_* values a schedule cannot use, each naming its key."""
    out = []
    if schedule not in SCHEDULES:
        out.append(f"trainer.lr_schedule={schedule!r}; choose one of: {', '.join(SCHEDULES)}")
    if warmup_steps < 0:
        out.append(f"trainer.lr_warmup_steps={warmup_steps} must be >= 0")
    if not 0 <= lr_min <= lr:
        out.append(f"trainer.lr_min={lr_min} must be in [0, trainer.lr={lr}] (the floor the decay ends at)")
    if decay_steps is not None and decay_steps < 1:
        out.append(f"trainer.lr_decay_steps={decay_steps} must be >= 1, or null (the run's optimizer updates: "
                   "steps x algo.updates_per_rollout)")
    elif decay_steps is not None and schedule != "constant" and decay_steps <= warmup_steps:
        out.append(f"trainer.lr_decay_steps={decay_steps} must exceed trainer.lr_warmup_steps={warmup_steps}: the "
                   "decay starts after the warm-up")
    return out
