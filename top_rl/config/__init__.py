"""The run config's schema: pure dataclasses, one section per component (docs/config.md lists every key).

It imports nothing else of top_rl (no contract, kernel, engine, driver, run or observe code: the never in
tests/repo/test_architecture.py), so the config sits on the ground, below everything that reads it. What it does not
hold: the checks of its values (top_rl/config_checks.py) and what the machine and the environment decide for a run
(top_rl/driver/resolution.py)."""

from top_rl.config.run import INSTALLED, RunConfig, TopConfig, kernel_backend, plain
from top_rl.config.typed import ConfigError, from_hydra

__all__ = ["INSTALLED", "ConfigError", "RunConfig", "TopConfig", "from_hydra", "kernel_backend", "plain"]
