"""The run's one resolution step: what the machine and the environment decide for a run, decided once on the driver
(the first of preflight's checks), written into the run config where the config names the choice (`installed`,
`auto`) and recorded in the run plan (`RunPlan.resolution`, the dry run's `resolution`):

- top.contract=installed: the contract of the SGLang release this interpreter imports (contract.fallback: the native
  engine's default where none is installed);
- where Ray runs: cluster.address, else $RAY_ADDRESS (the one place top_rl reads it), else a local Ray on this machine;
- top.attention_backend / rollout.logprob_source `auto`: from the driver's GPU and the contract (backend_choice.py);
- a bench's $TOP_RL_<SWITCH> (top_rl/kernels/plan.py): applied to top.fast_paths, so the resolved config (state.json,
  wandb, a resume's comparison) holds what every actor runs, and each one recorded as an override, never silently.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Mapping

from top_rl import contract
from top_rl.config import INSTALLED, ConfigError, kernel_backend
from top_rl.driver import backend_choice
from top_rl.kernels import plan as kernel_plans
from top_rl.kernels.plan import KernelPlan


class Unresolvable(ValueError):
    """What the machine cannot decide (the message names the keys to set instead)."""


@dataclass(frozen=True)
class EnvOverride:
    """A $TOP_RL_<SWITCH> that changed a top.fast_paths key the config set."""

    key: str  # top.fast_paths.<name>
    config: object  # what the config said
    value: object  # what the variable made it
    variable: str  # TOP_RL_<NAME>


@dataclass(frozen=True)
class Resolution:
    contract: str  # the run's TOP contract (top.contract after resolution)
    contract_from: str  # top.contract as set | the installed SGLang release's
    ray_address: str | None  # None: a local Ray on this machine
    ray_address_from: str  # cluster.address | RAY_ADDRESS | local
    backend: backend_choice.BackendChoice | None  # what `auto` chose; None: the config named both
    overrides: tuple[EnvOverride, ...] = ()  # $TOP_RL_<SWITCH> applied to top.fast_paths

    @property
    def on_cluster(self) -> bool:
        """A running Ray cluster, whose resources and GPUs this machine cannot see before it connects."""
        return self.ray_address is not None

    def as_dict(self) -> dict:
        return {"contract": self.contract, "contract_from": self.contract_from,
                "ray_address": self.ray_address or "local", "ray_address_from": self.ray_address_from,
                "attention_chosen_by": self.backend.why if self.backend else "the config",
                "overrides": [{"key": o.key, "config": str(o.config), "value": str(o.value), "by": o.variable}
                              for o in self.overrides]}


def _contract(cfg) -> tuple[str, str]:
    if cfg.top.contract != INSTALLED:
        return cfg.top.contract, "top.contract as set"
    from top_rl import sglang_release

    installed = sglang_release.installed_version()
    top = contract.fallback()
    return top.name, (f"the installed SGLang {installed}'s" if installed and top.sglang_version == installed
                      else "the default (no SGLang release with a contract installed)")


def _ray_address(cfg, environ: Mapping[str, str]) -> tuple[str | None, str]:
    if cfg.cluster.address:
        return cfg.cluster.address, "cluster.address"
    if environ.get("RAY_ADDRESS"):
        return environ["RAY_ADDRESS"], "RAY_ADDRESS"
    return None, "local"


def resolve(cfg, environ: Mapping[str, str] | None = None) -> Resolution:
    """Decide cfg's machine- and environment-dependent values in place (module doc), once. Refuses a bad
    $TOP_RL_<SWITCH> (ConfigError) and, on a Ray cluster whose driver sees no GPU, `auto` (Unresolvable:
    backend_choice.resolve)."""
    env = os.environ if environ is None else environ
    cfg.top.contract, contract_from = _contract(cfg)
    address, address_from = _ray_address(cfg, env)
    try:
        backend = backend_choice.resolve(cfg, on_cluster=address is not None)
    except ValueError as e:
        raise Unresolvable(str(e)) from None
    overrides = _fast_path_overrides(cfg, env)
    return Resolution(cfg.top.contract, contract_from, address, address_from, backend, overrides)


def _fast_path_overrides(cfg, env: Mapping[str, str]) -> tuple[EnvOverride, ...]:
    """The $TOP_RL_<SWITCH> values (read by the kernel plan's builder, the one reader), applied to cfg.top.fast_paths
    and returned as overrides where they change what the config said."""
    try:
        built = kernel_plans.switches(cfg.top.fast_paths, env)
    except ValueError as e:  # a bad $TOP_RL_<SWITCH>
        raise ConfigError(f"invalid config: {e}") from None
    said, now = dataclasses.asdict(cfg.top.fast_paths), dataclasses.asdict(built)
    overrides = tuple(EnvOverride(f"top.fast_paths.{k}", said[k], now[k], kernel_plans.FAST_PATH_ENV[k])
                      for k in said if said[k] != now[k])
    cfg.top.fast_paths = built
    return overrides


def kernel_plan(cfg, resolution: Resolution | None = None) -> KernelPlan:
    """The run's KernelPlan from the resolved config (its fast paths already hold any $TOP_RL_<SWITCH>, so the
    builder is given an empty environment: nothing is read twice)."""
    why = resolution.backend.why if resolution and resolution.backend else None
    return kernel_plans.build(kernel_backend(cfg), cfg.top.contract, cfg.top.attention_backend.value,
                              cfg.top.fast_paths, environ={}, attention_chosen_by=why)
