"""From the run config (Hydra's `rollout.sglang` plus run-level settings) to engine configs and the
dry-run plan. One rule lives here: the engine's attention backend defaults to the trainer's
(`top.attention_backend`), so a user sets it once; setting a different one is refused (config.py)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Mapping

from top_rl import contract, sglang_release
from top_rl.rollout.sglang.config import (FROM_THE_RUN, SglangEngineConfig, SglangSettings, TopConfigError,
                                         check_config, check_sglang_version)
from top_rl.rollout.sglang.launch import build_launch, check_extra_args

_FIELDS = {f.name for f in dataclasses.fields(SglangEngineConfig)}


def config_from_dict(d: Mapping[str, Any] | Any | None, index: int = 0, **run) -> SglangEngineConfig:
    """`d` (the run's rollout.sglang, or a mapping of SglangEngineConfig fields) over `run` (what the engine takes from
    the run: model_path, logprob_source, top, attention_backend; run_defaults). Engine `index` listens on port +
    index, so several engines can share a node."""
    if dataclasses.is_dataclass(d):  # Hydra's typed rollout.sglang (SglangSettings: keys and kinds checked)
        d = dataclasses.asdict(d)
        _check_types({"mem_fraction_static": d["mem_fraction_static"]})  # a number or a string: the range and `auto`
    else:
        d = dict(d or {})
        unknown = set(d) - _FIELDS
        if unknown:
            raise TopConfigError(f"rollout.sglang: unknown keys {sorted(unknown)}; known: {sorted(_FIELDS)}")
        _check_types(d)
    merged = {**{k: v for k, v in run.items() if v is not None}, **d}
    missing = [k for k in FROM_THE_RUN if merged.get(k) is None]
    if missing:
        raise TopConfigError(f"an SGLang engine takes {missing} from the run (model.path, top.attention_backend, "
                             f"rollout.logprob_source, top.enabled): pass them (plan.run_defaults)")
    for key in ("extra_args",):
        if key in merged:
            merged[key] = [str(a) for a in merged[key]]
    for key in ("env", "extra_sampling"):
        if key in merged:
            merged[key] = dict(merged[key])
    cfg = SglangEngineConfig(**merged)
    return dataclasses.replace(cfg, port=cfg.port + index)


def initial_policy_dir(run_dir) -> Path:
    """Where a run without model.path writes its random initial policy (HF format) for the servers to start from:
    a server loads a checkpoint at start; the trainer's weights reach it by the first weight push."""
    return (Path(run_dir) / "initial_policy").resolve()


def engine_weights_dir(run_dir, index: int) -> Path:
    """Where engine `index` writes the weight versions pushed to it by disk (cluster.weight_transport=disk) when
    rollout.sglang.weights_dir is unset: inside the run, not the system temp dir (a run's files live in run_dir). An
    absolute path, resolved on the driver: the engine's actor runs elsewhere (another working directory, maybe another
    node, which must see run_dir as the trainer ranks writing their checkpoint shards into it do)."""
    return (Path(run_dir) / "engines" / str(index)).resolve()


def _check_types(d: Mapping[str, Any]) -> None:
    """Each value has its field's kind (a mapping given in code; Hydra's rollout.sglang is typed already)."""
    defaults = {**dataclasses.asdict(SglangSettings()), **{k: "" for k in FROM_THE_RUN}, "top": True}
    for key, value in d.items():
        default = defaults[key]
        if isinstance(default, list):
            ok, kind = isinstance(value, (list, tuple)) and all(isinstance(v, (str, int, float)) for v in value), \
                "a list of strings, e.g. [--log-level, warning]"
        elif isinstance(default, dict):
            ok, kind = isinstance(value, Mapping), "a mapping"
            if ok and key == "env":  # a process environment holds strings; YAML reads `KEY: 1` as an int
                bad = [k for k, v in value.items() if not isinstance(v, str)]
                if bad:
                    raise TopConfigError(f"rollout.sglang.env.{bad[0]}={value[bad[0]]!r}: environment values are "
                                         f"strings; quote it (\"{value[bad[0]]}\")")
        elif isinstance(default, bool):
            ok, kind = isinstance(value, bool), "true or false"
        elif key == "mem_fraction_static":  # a share of the GPU, `auto` (top_rl/driver/memory_choice.py) or null
            ok = value is None or value == "auto" or (isinstance(value, (int, float)) and not isinstance(value, bool)
                                                     and 0 < value < 1)
            kind = "a number between 0 and 1, auto (sized from the GPU at start) or null (SGLang's own)"
        elif isinstance(default, (int, float)):
            ok, kind = isinstance(value, (int, float)) and not isinstance(value, bool), "a number"
            ok = ok and (isinstance(value, int) or not isinstance(default, int))
        else:
            ok, kind = value is None or isinstance(value, str), "a string"
        if not ok:
            raise TopConfigError(f"rollout.sglang.{key}={value!r}: expected {kind}")


def run_defaults(run_cfg) -> dict:
    """The run-level settings an SGLang engine takes from a top_rl.config.RunConfig."""
    return {"model_path": run_cfg.model.path or str(initial_policy_dir(run_cfg.run_dir)),
            "logprob_source": run_cfg.rollout.logprob_source, "top": run_cfg.top.enabled,
            "attention_backend": run_cfg.top.attention_backend, "enable_memory_saver": bool(run_cfg.cluster.gpu_handoff)}


def engine_config(run_cfg, index: int = 0) -> SglangEngineConfig:
    """Engine `index`'s server config, built once from the run config (rollout.sglang over run_defaults) and put
    through every refusal except the installed-version check (the planning machine need not have SGLang), extra_args
    included (top_rl.rollout.sglang.launch.check_extra_args). The run plan carries it to the engine's actor."""
    cfg = config_from_dict(run_cfg.rollout.sglang, index, **run_defaults(run_cfg))
    if not cfg.weights_dir:  # "" left the engine a mkdtemp in /tmp, never removed (issue 54)
        cfg = dataclasses.replace(cfg, weights_dir=str(engine_weights_dir(run_cfg.run_dir, index)))
    top = contract.get(run_cfg.top.contract)
    check_config(cfg, run_cfg.top.attention_backend, top, check_version=False)
    spec = build_launch(cfg, run_cfg.top.attention_backend, top=top, check=False)
    check_extra_args(spec.argv, cfg, top)
    return cfg


def launch_plan(run_cfg, index: int = 0) -> dict:
    """What `dry_run=true` prints for engine `index`: the exact command and the env TOP-RL sets, after
    engine_config's refusals. Without model.path the servers start from the run's
    random initial policy, written by trainer rank 0 at start."""
    cfg = engine_config(run_cfg, index)
    top = contract.get(run_cfg.top.contract)
    if sglang_release.installed_version(cfg.python) is not None:  # another release where the server would start: refused
        check_sglang_version(cfg, top)  # (a planning machine without SGLang plans; the engine's start() checks)
    spec = build_launch(cfg, run_cfg.top.attention_backend, top=top, check=False)
    return {"kind": "sglang", "url": cfg.url, **spec.describe(),
            "logprob_source": cfg.logprob_source, "attention_backend": cfg.attention_backend, "top": cfg.top,
            # auto: decided at start from the GPU, the model and the task's prompts (top_rl/driver/memory_choice.py)
            "mem_fraction_static": cfg.mem_fraction_static}
