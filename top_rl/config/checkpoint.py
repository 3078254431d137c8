"""The run config's checkpoint section (plain data: top_rl/run/checkpoint.py writes and prunes by it)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class CheckpointConfig:
    every: int = 0  # save every K steps (0: only at the end of the run, or when a signal stops it)
    keep: int = 2  # newest complete checkpoints kept (>= 1)
    # false: the run writes no checkpoint, not even at its end or on a stop signal, so it cannot be resumed (a
    # benchmark whose 4B checkpoint would be ~56 GB of optimizer state it never reads)
    enabled: bool = True
