"""Rollout engines behind one interface (top_rl/engine/interface.py): native (in-process) and sglang (servers)."""

from top_rl.engine.interface import RolloutEngine, RolloutSample, SamplingParams

__all__ = ["RolloutEngine", "RolloutSample", "SamplingParams"]
