"""The run's one resolution step (top_rl/driver/resolution.py): the installed release's contract, where Ray runs (the
one read of RAY_ADDRESS), `auto`, a bench's TOP_RL_* switches as recorded overrides; run once by preflight, carried by
the run plan and printed by the dry run."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

from top_rl import contract, preflight
from top_rl.cli import compose, launch_plan
from top_rl.config import INSTALLED, RunConfig
from top_rl.driver import resolution

ROOT = Path(__file__).resolve().parents[2]


def test_ray_address_is_read_in_one_place():
    readers = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "top_rl").rglob("*.py")
                     if any(isinstance(n, ast.Constant) and n.value == "RAY_ADDRESS"
                            for n in ast.walk(ast.parse(p.read_text()))))
    assert readers == ["top_rl/driver/resolution.py"]


def test_where_ray_runs_is_the_config_then_the_environment_then_this_machine():
    cfg = RunConfig()
    assert (resolution.resolve(cfg, environ={}).ray_address, resolution.resolve(cfg, environ={}).on_cluster) == \
        (None, False)
    assert resolution.resolve(RunConfig(), environ={"RAY_ADDRESS": "head:6379"}).ray_address_from == "RAY_ADDRESS"
    cfg = RunConfig()
    cfg.cluster.address = "ray://head:10001"
    r = resolution.resolve(cfg, environ={"RAY_ADDRESS": "other:6379"})
    assert (r.ray_address, r.ray_address_from, r.on_cluster) == ("ray://head:10001", "cluster.address", True)
    assert cfg.cluster.address == "ray://head:10001"  # the config is not rewritten with the environment's


def test_the_installed_contract_is_decided_at_resolution_not_at_import():
    cfg = RunConfig()
    assert cfg.top.contract == INSTALLED  # the schema names no release
    r = resolution.resolve(cfg, environ={})
    assert cfg.top.contract == r.contract == contract.fallback().name
    named = RunConfig()
    named.top.contract = "qwen3_dense_top_v1_deepgemm"
    assert resolution.resolve(named, environ={}).contract_from == "top.contract as set"


def test_a_bench_switch_is_applied_and_recorded_as_an_override():
    cfg = RunConfig()
    r = resolution.resolve(cfg, environ={"TOP_RL_DECODE_GRAPHS": "0", "TOP_RL_FUSED_FORWARD": "1"})
    assert cfg.top.fast_paths.decode_graphs is False  # what every actor runs, in the resolved config
    # only what changed the config's value is an override (fused_forward was already on)
    assert [o.variable for o in r.overrides] == ["TOP_RL_DECODE_GRAPHS"]
    assert r.as_dict()["overrides"] == [{"key": "top.fast_paths.decode_graphs", "config": "True", "value": "False",
                                         "by": "TOP_RL_DECODE_GRAPHS"}]
    assert resolution.kernel_plan(cfg, r).fast_paths.decode_graphs is False


def test_preflight_resolves_once_and_the_plan_carries_it(tmp_path, monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    cfg = compose([f"run_dir={tmp_path / 'run'}", "rollout.prompts_per_step=2", "rollout.n_samples=4"])
    ready = preflight.check(cfg)
    plan = preflight.run_plan(cfg, ready)
    assert plan.resolution is ready.resolution and plan.ray_address is None
    assert plan.kernels.contract == ready.resolution.contract == cfg.top.contract
    assert launch_plan(cfg, ready.resolution)["resolution"] == ready.resolution.as_dict()


def test_the_dry_run_prints_the_resolution(tmp_path):
    env = {**os.environ, "RAY_ADDRESS": "head:6379", "TOP_RL_FUSED_BACKWARD": "0", "WANDB_MODE": "disabled",
           "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    out = subprocess.run([sys.executable, "-m", "top_rl.cli", f"run_dir={tmp_path}", "dry_run=true"],
                         capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout[out.stdout.index("{"):])
    r = plan["resolution"]
    assert (r["ray_address"], r["ray_address_from"], plan["ray"]["address"]) == ("head:6379", "RAY_ADDRESS", "head:6379")
    assert r["contract"] == contract.fallback().name and r["attention_chosen_by"] == "the config"
    assert r["overrides"] == [{"key": "top.fast_paths.fused_backward", "config": "True", "value": "False",
                               "by": "TOP_RL_FUSED_BACKWARD"}]
