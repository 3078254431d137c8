"""The run config's tracking section: wandb and the console (plain data: top_rl/observe/tracking.py logs by it)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class WandbMode(StrEnum):
    auto = "auto"  # $WANDB_MODE, else online with $WANDB_API_KEY, else offline
    online = "online"
    offline = "offline"
    disabled = "disabled"


@dataclass
class TrackingConfig:
    # auto: $WANDB_MODE, else online with $WANDB_API_KEY, else offline | online | offline | disabled
    wandb_mode: WandbMode = WandbMode.auto
    project: str = "top-rl"  # the wandb project
    console: bool = True  # print one line per step
    entity: str | None = None  # the wandb entity (team); None: the account's default
    run_name: str | None = None  # the wandb run's name; None: wandb picks one
    # the first N rows of each step's samples file (rollout.save_samples_every) also go to wandb, as the table
    # "samples" (group, prompt, response, reward) in that step's history; 0: none
    wandb_samples: int = 8
