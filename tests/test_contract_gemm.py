"""The TOP contract names its GEMM path; SGLang's switch for it is derived from that name on both sides (the
engine's launch env, the trainer's pinned env), and every mismatch is refused with a message naming the fix."""

from __future__ import annotations

import json
import sys
from types import SimpleNamespace

import pytest

from top_rl import contract
from top_rl.kernels import sglang as sg
from top_rl.rollout.sglang_config import SglangEngineConfig, TopConfigError, check_config
from top_rl.rollout.sglang_launch import build_launch

V1, DG = contract.QWEN3_DENSE_TOP_V1, contract.QWEN3_DENSE_TOP_V1_DEEPGEMM
ENV = {"PATH": "/usr/bin"}


@pytest.fixture(autouse=True)
def clean(monkeypatch):
    for key in ("TOP_RL_CONTRACT", contract.GEMM_ENV, "SGLANG_ENABLE_JIT_DEEPGEMM",
                "SGLANG_ENABLE_DETERMINISTIC_INFERENCE"):
        monkeypatch.setenv(key, "")  # recorded, so whatever pin_engine_env sets is undone after the test
        monkeypatch.delenv(key)
    monkeypatch.setattr(sg, "_contract_name", None)
    monkeypatch.setattr(sg, "_ops_contract", None)


def _cfg(**kw):
    return SglangEngineConfig(**{"model_path": "/models/Qwen3-0.6B", "python": sys.executable, **kw})


def test_contracts_name_their_gemm():
    assert contract.DEFAULT is V1 and V1.gemm == "triton_persistent" and DG.gemm == "deepgemm"
    assert dict(V1.engine_env)[contract.GEMM_ENV] == "0"
    assert dict(DG.engine_env)[contract.GEMM_ENV] == "1" and dict(DG.engine_env)["SGLANG_ENABLE_JIT_DEEPGEMM"] == "1"
    for c in (V1, DG):
        assert dict(c.engine_env)["SGLANG_ENABLE_DETERMINISTIC_INFERENCE"] == "1"
        d = json.loads(json.dumps(c.describe()))
        assert d["gemm"] == c.gemm and dict(map(tuple, d["engine_env"])) == dict(c.engine_env)
    assert contract.get(DG.name) is DG
    assert DG.name not in contract.CONTRACTS  # not a run option until proven on a GPU


def test_unknown_gemm_or_gemm_switch_in_base_env_refused():
    import dataclasses

    with pytest.raises(ValueError, match="gemm='cublas'.*deepgemm.*triton_persistent"):
        dataclasses.replace(V1, gemm="cublas")
    with pytest.raises(ValueError, match="GEMM path"):
        dataclasses.replace(V1, base_engine_env=((contract.GEMM_ENV, "1"),))


@pytest.mark.parametrize("top", [V1, DG], ids=lambda c: c.gemm)
def test_engine_launch_env_follows_the_contract(top):
    spec = build_launch(_cfg(), "fa3", base_env=ENV, top=top, check=False)
    for key, want in top.engine_env:
        assert spec.env[key] == want and spec.describe()["env"][key] == want


def test_engine_env_contradicting_the_gemm_path_refused():
    with pytest.raises(TopConfigError, match=f"{contract.GEMM_ENV}='0'.*pins '1'"):
        check_config(_cfg(), "fa3", top=DG, base_env={**ENV, contract.GEMM_ENV: "0"})
    with pytest.raises(TopConfigError, match=f"{contract.GEMM_ENV}='1'.*pins '0'"):
        check_config(_cfg(env={contract.GEMM_ENV: "1"}), "fa3", top=V1, base_env=ENV)


def test_trainer_pins_the_gemm_path_of_its_contract(monkeypatch):
    import os

    sg.pin_engine_env()
    assert os.environ[contract.GEMM_ENV] == "0"
    monkeypatch.delenv(contract.GEMM_ENV)
    monkeypatch.setenv("TOP_RL_CONTRACT", DG.name)
    assert sg.active_contract() is DG
    sg.pin_engine_env()
    assert os.environ[contract.GEMM_ENV] == "1" and os.environ["SGLANG_ENABLE_JIT_DEEPGEMM"] == "1"


def test_trainer_env_contradicting_its_contract_refused(monkeypatch):
    monkeypatch.setenv(contract.GEMM_ENV, "0")
    sg.set_contract(DG.name)
    with pytest.raises(RuntimeError, match=r"ENABLE_MM_DEEPGEMM='0'.*qwen3_dense_top_v1_deepgemm.*pins '1'"):
        sg.pin_engine_env()
    with pytest.raises(ValueError, match="unknown TOP contract"):
        sg.set_contract("qwen3_dense_top_v2")


def test_gemm_sglang_would_run_must_be_the_contracts():
    sg.check_gemm_path(V1, deepgemm_active=False)
    sg.check_gemm_path(DG, deepgemm_active=True)
    with pytest.raises(RuntimeError, match="names gemm='deepgemm'.*Triton.*deep_gemm"):
        sg.check_gemm_path(DG, deepgemm_active=False)
    with pytest.raises(RuntimeError, match="DeepGEMM on.*gemm='triton_persistent'"):
        sg.check_gemm_path(V1, deepgemm_active=True)


def test_ops_refuses_a_deepgemm_contract_where_sglang_runs_triton(monkeypatch):
    """ops() reads SGLang's own flags after importing it: here DeepGEMM is not importable (as on the lent H200)."""
    fake = SimpleNamespace(_ENABLE_MM_DEEPGEMM=True, ENABLE_JIT_DEEPGEMM=False, matmul_persistent=None,
                           mean_dim=None, log_softmax=None)
    monkeypatch.setitem(sys.modules, "sglang.srt.batch_invariant_ops.batch_invariant_ops", fake)
    monkeypatch.setitem(sys.modules, "sglang.srt.batch_invariant_ops",
                        SimpleNamespace(batch_invariant_ops=fake))
    monkeypatch.setattr(sg, "_wheel_apply_rotary_emb", lambda: (lambda *a: None))
    sg.ops.cache_clear()
    sg.set_contract(DG.name)
    try:
        with pytest.raises(RuntimeError, match="names gemm='deepgemm'"):
            sg.ops()
        sg.set_contract(None)
        monkeypatch.delenv(contract.GEMM_ENV)  # the refused attempt had pinned the deepgemm contract's value
        assert sg.ops().mm is None and sg._ops_contract == V1.name  # the default contract: Triton, as SGLang runs
        with pytest.raises(RuntimeError, match="already loaded under contract 'qwen3_dense_top_v1'"):
            sg.set_contract(DG.name)
    finally:
        sg.ops.cache_clear()
