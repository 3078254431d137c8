"""The TOP contract names its GEMM path; SGLang's switch for it is derived from that name on both sides (the
engine's launch env, the trainer's pinned env), and every mismatch is refused with a message naming the fix."""

from __future__ import annotations

import json
import os
import sys
from types import SimpleNamespace

import pytest

from top_rl import contract
from top_rl.kernels import plan as kplan
from top_rl.kernels.sglang import backend as sg
from top_rl.kernels.sglang import engine_env
from top_rl.rollout.sglang.config import SglangEngineConfig, TopConfigError, check_config
from top_rl.rollout.sglang.launch import build_launch

V1, DG = contract.QWEN3_DENSE_TOP_V1, contract.QWEN3_DENSE_TOP_V1_DEEPGEMM
ENV = {"PATH": "/usr/bin"}


@pytest.fixture(autouse=True)
def clean(monkeypatch):
    for key in ("TOP_RL_CONTRACT", contract.GEMM_ENV, "SGLANG_ENABLE_JIT_DEEPGEMM",
                "SGLANG_ENABLE_DETERMINISTIC_INFERENCE"):
        monkeypatch.setenv(key, "")  # recorded, so whatever pin_engine_env sets is undone after the test
        monkeypatch.delenv(key)
    monkeypatch.setattr(kplan, "_installed", kplan.build(environ={}))
    monkeypatch.setattr(engine_env, "loaded_under", None)


def _contract(name):
    """The process's plan computes under contract `name` (as kernels.install(plan) sets it)."""
    sg.check_plan(kplan.build(contract=name))  # refused once SGLang's kernels were loaded under another
    kplan.set_current(kplan.build(contract=name))


# V1 and DG are 0.5.11's contracts. Their GEMM pins are checked whatever release is installed (CI's second pass runs
# 0.5.17), so the engine configs here skip the version check, which tests/rollout/test_sglang_engine_refusals.py tests.
def _cfg(**kw):
    return SglangEngineConfig(**{"model_path": "/models/Qwen3-0.6B", "python": sys.executable,
                                 "skip_version_check": True, "attention_backend": "fa3", "logprob_source": "prefill",
                                 "top": True, **kw})


def test_contracts_name_their_gemm():
    assert contract.DEFAULT is V1 and V1.gemm == "triton_persistent" and DG.gemm == "deepgemm"
    assert dict(V1.engine_env)[contract.GEMM_ENV] == "0"
    assert dict(DG.engine_env)[contract.GEMM_ENV] == "1" and dict(DG.engine_env)["SGLANG_ENABLE_JIT_DEEPGEMM"] == "1"
    for c in (V1, DG):
        assert dict(c.engine_env)["SGLANG_ENABLE_DETERMINISTIC_INFERENCE"] == "1"
        d = json.loads(json.dumps(c.describe()))
        assert d["gemm"] == c.gemm and dict(map(tuple, d["engine_env"])) == dict(c.engine_env)
    assert contract.get(DG.name) is DG
    V17 = contract.QWEN3_DENSE_TOP_V1_SGLANG_0_5_17
    assert set(contract.CONTRACTS) == {V1.name, DG.name, V17.name}  # the run options (top.contract)
    # 0.5.17 has only the Triton GEMM: its DeepGEMM is another package, unmeasured (numerics_0.5.17.md §0.1.3)
    assert contract.with_gemm(V17, "deepgemm") == [] and contract.with_gemm(V17, "triton_persistent") == [V17.name]


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

    sg.pin_engine_env()  # no plan names one: the installed release's contract, Triton GEMM on 0.5.11 and 0.5.17
    assert os.environ[contract.GEMM_ENV] == "0"
    monkeypatch.delenv(contract.GEMM_ENV)
    monkeypatch.setenv("TOP_RL_CONTRACT", DG.name)  # a bench's choice: read by the plan builder only
    assert sg.active_contract() is contract.fallback()
    kplan.set_current(kplan.build())
    assert sg.active_contract() is DG
    sg.pin_engine_env()
    assert os.environ[contract.GEMM_ENV] == "1" and os.environ["SGLANG_ENABLE_JIT_DEEPGEMM"] == "1"


def test_trainer_env_contradicting_its_contract_refused(monkeypatch):
    monkeypatch.setenv(contract.GEMM_ENV, "0")
    _contract(DG.name)
    with pytest.raises(RuntimeError, match=r"ENABLE_MM_DEEPGEMM='0'.*qwen3_dense_top_v1_deepgemm.*pins '1'"):
        sg.pin_engine_env()
    with pytest.raises(ValueError, match="unknown TOP contract"):
        kplan.build(contract="qwen3_dense_top_v2")


def test_gemm_sglang_would_run_must_be_the_contracts():
    engine_env.check_gemm_path(V1, deepgemm_active=False)
    engine_env.check_gemm_path(DG, deepgemm_active=True)
    with pytest.raises(RuntimeError, match="names gemm='deepgemm'.*Triton.*deep_gemm"):
        engine_env.check_gemm_path(DG, deepgemm_active=False)
    with pytest.raises(RuntimeError, match="DeepGEMM on.*gemm='triton_persistent'"):
        engine_env.check_gemm_path(V1, deepgemm_active=True)


def test_ops_refuses_a_deepgemm_contract_where_sglang_runs_triton(monkeypatch):
    """ops() reads SGLang's own flags after importing it: here DeepGEMM is not importable (as on the lent H200)."""
    fake = SimpleNamespace(_ENABLE_MM_DEEPGEMM=True, ENABLE_JIT_DEEPGEMM=False, matmul_persistent=None,
                           mean_dim=None, log_softmax=None)
    monkeypatch.setitem(sys.modules, "sglang.srt.batch_invariant_ops.batch_invariant_ops", fake)
    monkeypatch.setitem(sys.modules, "sglang.srt.batch_invariant_ops",
                        SimpleNamespace(batch_invariant_ops=fake))
    monkeypatch.setattr(sg, "_wheel_apply_rotary_emb", lambda: (lambda *a: None))
    sg.ops.cache_clear()
    _contract(DG.name)
    try:
        with pytest.raises(RuntimeError, match="names gemm='deepgemm'"):
            sg.ops()
        _contract(V1.name)
        monkeypatch.delenv(contract.GEMM_ENV)  # the refused attempt had pinned the deepgemm contract's value
        assert sg.ops().mm is None and engine_env.loaded_under == V1.name  # the default: Triton, as SGLang runs
        with pytest.raises(RuntimeError, match="already loaded under contract 'qwen3_dense_top_v1'"):
            _contract(DG.name)
    finally:
        sg.ops.cache_clear()


def _dg_package(root, files):
    pkg = root / "deep_gemm"
    for rel, text in files.items():
        (pkg / "include" / rel).parent.mkdir(parents=True, exist_ok=True)
        (pkg / "include" / rel).write_text(text)
    (pkg / "__init__.py").write_text("")
    return SimpleNamespace(__file__=str(pkg / "__init__.py")), pkg


def test_deep_gemm_digest_covers_every_header_and_python_file(tmp_path):
    from top_rl.kernels.sglang import deep_gemm_source as dgs

    _, pkg = _dg_package(tmp_path, {"deep_gemm/impls/sm90_bf16_gemm.cuh": "a", "cute/tensor.hpp": "b"})
    d0 = dgs.package_digest(pkg)
    assert dgs.package_digest(pkg) == d0 and len(d0) == 64
    (pkg / "deep_gemm_cpp.so").write_bytes(b"\x7fELF")  # the built extension and the build record: not sources
    (pkg / "REVISION").write_text("ffe2b6b local build\n")
    assert dgs.package_digest(pkg) == d0
    (pkg / "include" / "cute" / "tensor.hpp").write_text("c")
    d1 = dgs.package_digest(pkg)
    (pkg / "include" / "cute" / "tensor.hpp").rename(pkg / "include" / "cute" / "tensor2.hpp")
    d2 = dgs.package_digest(pkg)
    (pkg / "__init__.py").write_text("from . import deep_gemm_cpp\n")
    d3 = dgs.package_digest(pkg)
    assert len({d0, d1, d2, d3}) == 4
    with pytest.raises(FileNotFoundError, match="no include/"):
        dgs.package_digest(tmp_path)


def test_contract_and_gpu_bundle_name_the_same_deep_gemm():
    """The contract's pins and the defaults scripts/gpu_bundle.sh packs must not drift apart."""
    import re
    from pathlib import Path

    import subprocess

    path = Path(__file__).resolve().parents[2] / "scripts" / "gpu_bundle.sh"
    rev = re.search(r"DEEPGEMM_REV=\$\{DEEPGEMM_REV:-([0-9a-f]{40})\}", path.read_text()).group(1)
    # the wheel the deep_gemm group packs (0.5.11's: the contract's DeepGEMM is sglang-kernel 0.4.2's package)
    env = {k: v for k, v in os.environ.items() if k != "SGLANG_KERNEL"}
    wheel = subprocess.run(["bash", str(path), "--release", "0.5.11", "--list", "deep_gemm"], capture_output=True,
                           text=True, check=True, env=env).stdout.strip()
    assert rev == contract.DEEPGEMM_SOURCE["rev"]
    assert contract.DEEPGEMM_SOURCE["package"].startswith(wheel + " ")
    assert DG.describe()["deep_gemm"] == contract.DEEPGEMM_SOURCE and "deep_gemm" not in V1.describe()


def _fake_bio(monkeypatch, module):
    fake = SimpleNamespace(_ENABLE_MM_DEEPGEMM=True, ENABLE_JIT_DEEPGEMM=True, deep_gemm=module,
                           matmul_persistent="mm", mean_dim=None, log_softmax=None)
    monkeypatch.setitem(sys.modules, "sglang.srt.batch_invariant_ops.batch_invariant_ops", fake)
    monkeypatch.setitem(sys.modules, "sglang.srt.batch_invariant_ops", SimpleNamespace(batch_invariant_ops=fake))
    monkeypatch.setattr(sg, "_wheel_apply_rotary_emb", lambda: (lambda *a: None))


def test_ops_refuses_a_deep_gemm_with_other_sources_than_the_engines(monkeypatch, tmp_path):
    """DeepGEMM on and importable, but its sources are not sglang-kernel's, or its build records another host
    code commit: refused before any GEMM; the engine's sources and commit: accepted."""
    from top_rl.kernels.sglang import deep_gemm_source as dgs

    module, pkg = _dg_package(tmp_path, {"deep_gemm/impls/sm90_bf16_gemm.cuh": "another release"})
    _fake_bio(monkeypatch, module)
    sg.ops.cache_clear()
    _contract(DG.name)
    try:
        with pytest.raises(RuntimeError, match=r"other sources than the engine's \(sglang-kernel==0.4.2.*gpu_bundle"):
            sg.ops()
        monkeypatch.setitem(contract.DEEPGEMM_SOURCE, "sources_sha256", dgs.package_digest(pkg))
        (pkg / "REVISION").write_text("a348cd95a8ddfd3ef337b595d8e8b841c0d9cf0f upstream\n")
        with pytest.raises(RuntimeError, match=r"built from DeepGEMM a348cd95a8dd, the engine's .* from ffe2b6b97420"):
            sg.ops()
        (pkg / "REVISION").write_text(contract.DEEPGEMM_SOURCE["rev"] + " sglang-kernel==0.4.2\n")
        assert sg.ops().mm == "mm" and engine_env.loaded_under == DG.name
    finally:
        sg.ops.cache_clear()


def _sglang_run(*overrides):
    from top_rl.cli import compose

    engine = ["rollout.engine=sglang", "rollout.logprob_source=prefill", "model.path=/models/Qwen3-0.6B",
              "rollout.sglang.skip_version_check=true"]  # V1/DG are 0.5.11's, whatever release is installed
    return compose(["top.kernels=sglang", *engine, *overrides])


def test_top_contract_chooses_the_engines_gemm_in_the_launch_plan():
    """`top.contract` is a run option: the dry-run plan's server env carries that contract's GEMM switches."""
    from top_rl.rollout.sglang.plan import launch_plan

    for top in (V1, DG):
        plan = launch_plan(_sglang_run(f"top.contract={top.name}"))
        assert all(plan["env"][k] == v for k, v in top.engine_env)


def test_deepgemm_contract_needs_the_sglang_kernels():
    from top_rl.cli import compose
    from top_rl.config import ConfigError

    with pytest.raises(ConfigError, match=f"top.contract={DG.name} names DeepGEMM.*set top.kernels=sglang"):
        compose([f"top.contract={DG.name}"])  # the embedded job's reference kernels
    with pytest.raises(ConfigError, match="top.contract"):
        compose(["top.contract=qwen3_dense_top_v2"])
    assert _sglang_run(f"top.contract={DG.name}").top.contract == DG.name


def test_actors_compute_under_the_runs_contract(monkeypatch):
    """Every actor process pins the run's contract before its first kernel (its GEMM path is fixed at import)."""
    import top_rl.driver.actors as actors

    monkeypatch.setattr(actors.ray, "get_gpu_ids", lambda: [0])
    monkeypatch.setattr(actors.torch, "set_num_threads", lambda n: None)
    monkeypatch.setattr("top_rl.observe.quiet.install", lambda: None)
    monkeypatch.setattr(actors.rendezvous, "bind_gloo", lambda host: None)  # it sets GLOO_SOCKET_IFNAME for good
    from top_rl import kernels

    monkeypatch.setattr(kernels, "_active", kernels._active)
    actors._setup_process(kplan.build("sglang", DG.name, "triton"), 1)  # a plan Ray carried from the driver
    assert sg.active_contract() is DG and kernels.current_plan().attention == "triton"
    actors._setup_process(kplan.build("reference", V1.name), 1)
    assert kernels.backend_name() == "reference" and sg.active_contract() is V1
