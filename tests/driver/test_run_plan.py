"""The run plan (top_rl/driver/plan.py): preflight decides what the cluster starts, once, frozen; an SGLang engine's
server config is built and checked there, never again from a dict."""

from __future__ import annotations

import dataclasses

import pytest

from top_rl import preflight
from top_rl.cli import compose
from top_rl.rollout.sglang.config import SglangEngineConfig

SMALL = ["rollout.prompts_per_step=2", "rollout.n_samples=4", "rollout.max_new_tokens=3", "cluster.torch_threads=1"]


def test_preflight_plans_the_default_run(tmp_path):
    cfg = compose([f"run_dir={tmp_path / 'run'}", *SMALL, "trainer.pp=2", "cluster.num_cpus=4"])
    ready = preflight.check(cfg)
    plan = preflight.run_plan(cfg, ready)
    assert plan.trainer.world == 2 == len(plan.placement.trainer_bundle)
    assert plan.trainer.trainer_cfg.dtype == cfg.model.dtype  # one compute dtype both sides
    assert plan.trainer.vocab_size == ready.task.vocab_size and plan.trainer.arch is ready.model_cfg
    assert [(e.kind, e.logprob_source, e.sglang) for e in plan.engines] == [("native", "decode", None)]
    assert (plan.kernels.backend, plan.kernels.contract) == ("reference", cfg.top.contract)
    assert plan.initial_policy is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.engines = ()
    assert not (tmp_path / "run").exists()  # planning writes nothing


def test_each_sglang_engine_gets_its_checked_server_config(tmp_path):
    cfg = compose([f"run_dir={tmp_path / 'run'}", "rollout=sglang", "rollout.num_engines=2",
                   "rollout.sglang.port=31000", "rollout.sglang.skip_version_check=true",
                   "rollout.sglang.validate_with_parser=false"])
    ready = preflight.check(cfg, preflight.CONFIG_CHECKS)
    assert all(isinstance(s, SglangEngineConfig) for s in ready.sglang)
    assert [s.port for s in ready.sglang] == [31000, 31001]
    # no model.path: the servers start from the run's random initial policy, which trainer rank 0 writes
    assert {s.model_path for s in ready.sglang} == {str((tmp_path / "run" / "initial_policy").resolve())}
    assert {s.attention_backend for s in ready.sglang} == {cfg.top.attention_backend}


def test_the_fault_plan_is_read_once_into_the_run_plan_and_the_trainer_spec(tmp_path, monkeypatch):
    from top_rl.run.fault_injection import NO_FAULTS, FaultPlan

    cfg = compose([f"run_dir={tmp_path / 'run'}", *SMALL])
    assert preflight.run_plan(cfg, preflight.check(cfg)).faults == NO_FAULTS  # unset: an empty plan
    monkeypatch.setenv("TOP_RL_FAULT", "kill_engine:2,enospc_in_trainer_checkpoint:1")
    ready = preflight.check(cfg)
    monkeypatch.delenv("TOP_RL_FAULT")  # read at the check, never again
    plan = preflight.run_plan(cfg, ready)
    assert plan.faults == FaultPlan.parse("kill_engine:2,enospc_in_trainer_checkpoint:1") == plan.trainer.faults
