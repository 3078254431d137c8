"""A second contract that differs is honoured where the run's contract is read (issue 33 item 2): the config's choices,
the kernel plan, the reference kernels' tiling and the SGLang refusals follow top.contract, not the default."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from top_rl import config, config_checks, contract
from top_rl.config.kernels import AttentionBackend
from top_rl.kernels import plan as kplan
from top_rl.kernels import tiled_gemm
from top_rl.rollout.sglang.config import TopConfigError, check_tp
from tests.helpers import sglang_engine_config

# Another release's contract: triton attention only, other GEMM tiles (a made-up one: nothing runs it on a GPU).
OTHER = dataclasses.replace(contract.DEFAULT, name="other_release_v1", sglang_version="9.9.9",
                            attention_backends=("triton",), tiling=contract.GemmTiling(row_tile=32, k_chunk=32))


@pytest.fixture
def other(monkeypatch):
    monkeypatch.setitem(contract.CONTRACTS, OTHER.name, OTHER)
    return OTHER


def _cfg(name: str, backend: str) -> config.RunConfig:
    cfg = config.RunConfig()
    cfg.top.contract, cfg.top.attention_backend = name, AttentionBackend(backend)
    return cfg


def test_the_config_checks_the_backend_against_the_run_contract(other):
    config_checks.validate(_cfg(contract.DEFAULT.name, "flashinfer"))  # the default contract allows it
    with pytest.raises(config.ConfigError, match="top.attention_backend='flashinfer' is not allowed; choose one of: triton"):
        config_checks.validate(_cfg(other.name, "flashinfer"))
    config_checks.validate(_cfg(other.name, "triton"))


def test_the_plan_and_the_reference_tiling_are_the_run_contract(other, monkeypatch):
    with pytest.raises(ValueError, match="other_release_v1"):
        kplan.build("reference", other.name, "fa3", environ={})
    monkeypatch.setattr(kplan, "_installed", kplan.build("reference", other.name, environ={}))
    assert tiled_gemm.contract_tiling() == other.tiling
    x, w = torch.randn(3, 64, dtype=torch.float64), torch.randn(5, 64, dtype=torch.float64)
    assert tiled_gemm.k_partials(x, w, tiled_gemm.contract_tiling()).shape[0] == 2  # K=64 in chunks of 32
    torch.testing.assert_close(tiled_gemm.matmul_nt(x, w), x @ w.T)


def test_sglang_refusals_name_the_run_contract_release(other):
    with pytest.raises(TopConfigError, match="SGLang 9.9.9 has no TP>1"):
        check_tp(sglang_engine_config(tp_size=2), other)
