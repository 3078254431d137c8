"""One adapter per SGLang release (issue 33): every contract's release has one, the installed release picks the
contract where nothing names one, another release is refused naming the releases with a contract, and every
SGLang-internal module path top_rl/ imports is a release's (an adapter's) or stable across the releases."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from top_rl import contract, sglang_release
from top_rl.rollout.sglang import config as sglang_config
from top_rl.rollout.sglang.config import TopConfigError
from tests.helpers import sglang_engine_config

ROOT = Path(__file__).resolve().parents[2]
V11, V17 = contract.QWEN3_DENSE_TOP_V1, contract.QWEN3_DENSE_TOP_V1_SGLANG_0_5_17


def test_every_contract_has_its_release_adapter_and_every_release_a_default_contract():
    assert set(sglang_release.RELEASES) == {"0.5.11", "0.5.17"}
    for c in contract.CONTRACTS.values():
        assert c.release is sglang_release.get(c.sglang_version)
        assert c.describe()["release"]["sglang"] == c.sglang_version
    assert set(contract.RELEASE_DEFAULTS) == set(sglang_release.RELEASES)
    assert all(c.gemm == "triton_persistent" for c in contract.RELEASE_DEFAULTS.values())
    assert sglang_release.get("0.5.11").status == "proven" and sglang_release.get("0.5.17").status == "proven"


def test_the_0517_contract_keeps_prefill_eager_and_linears_on_mm_bi():
    flags = V17.engine_flags
    assert flags[: len(V11.engine_flags)] == V11.engine_flags
    assert flags[flags.index("--cuda-graph-backend-prefill") + 1] == "disabled"
    assert flags[flags.index("--bf16-gemm-backend") + 1] == "torch"
    assert V17.release.argv_pinned["cuda_graph_backend_prefill"] == "disabled"
    assert V17.release.dest("tensor_parallel_size") == "tp_size" and V11.release.dest("tensor_parallel_size") == \
        "tensor_parallel_size"


def test_an_unknown_release_is_refused_naming_the_releases_with_a_contract():
    with pytest.raises(ValueError, match=r"top-rl: SGLang 0\.5\.12 has no TOP contract; .*"
                                         r"0\.5\.11 \(proven on a GPU\), 0\.5\.17 \(proven on a GPU\)"):
        sglang_release.get("0.5.12")
    with pytest.raises(ValueError, match="0.5.12 has no TOP contract"):
        contract.for_release("0.5.12")
    assert contract.for_release("0.5.17") is V17 and contract.for_release("0.5.11") is V11


@pytest.mark.parametrize("installed, want", [("0.5.11", V11), ("0.5.17", V17), (None, V11), ("0.5.12", V11)])
def test_the_installed_release_picks_the_contract_where_none_is_named(monkeypatch, installed, want):
    monkeypatch.setattr(sglang_release, "installed_version", lambda: installed)
    assert contract.fallback() is want


@pytest.mark.parametrize("have", ["0.5.12", "0.5.17"])
def test_the_engine_refuses_another_release_before_a_server_starts(monkeypatch, have):
    monkeypatch.setattr(sglang_release, "installed_version", lambda python: have)
    with pytest.raises(TopConfigError) as e:
        sglang_config.check_sglang_version(sglang_engine_config(), V11)
    msg = str(e.value)
    assert f"sglang {have} is installed" in msg and "The releases with a TOP contract: 0.5.11" in msg
    assert (f"top.contract={V17.name}" in msg) == (have == "0.5.17")


def test_one_reader_of_the_installed_release():
    """sglang_release.installed_version is the only place that asks which sglang is installed (the contract's fallback,
    the engine's refusal and the dry run all call it), so the three can never disagree about the release."""
    readers = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "top_rl").rglob("*.py")
                     if re.search(r"""version\((['"])sglang\1\)""", p.read_text()))
    assert readers == ["top_rl/sglang_release/__init__.py"]


def test_an_interpreter_that_cannot_run_is_one_top_rl_line(tmp_path):
    missing = tmp_path / "no-python"
    with pytest.raises(ValueError, match=rf"^top-rl: cannot run the configured python '{missing}'.*rollout.sglang.python"):
        sglang_release.installed_version(str(missing))
    assert sglang_release.installed_version(None) == sglang_release.installed_version(sys.executable)


# Module paths under sglang.* that top_rl/ may spell out: the same in every release with a contract (checked against
# both wheels' trees in docs/numerics_0.5.17.md §14). A path that moved is an adapter field, never spelled in code.
STABLE = {"sglang.srt.server_args", "sglang.srt.batch_invariant_ops", "sglang.srt.layers.rotary_embedding.utils",
          "sglang.srt.utils.common", "sglang.srt.utils.patch_torch", "sglang.srt.weight_sync.tensor_bucket",
          "sglang.launch_server"}


def test_sglang_internal_paths_in_code_are_stable_or_an_adapters():
    moved = {p for r in sglang_release.RELEASES.values()
             for p in (r.triton_extend_module, r.triton_decode_module, r.fla_logger)}
    found = {}
    for p in sorted((ROOT / "top_rl").rglob("*.py")):
        rel = p.relative_to(ROOT).as_posix()
        if rel.startswith("top_rl/sglang_release/"):
            continue
        for m in re.finditer(r"^\s*(?:from|import)\s+(sglang(?:\.\w+)+)|[\"'](sglang(?:\.\w+)+)[\"']", p.read_text(), re.M):
            path = m.group(1) or m.group(2)
            if path not in STABLE:
                found.setdefault(rel, []).append(path)
    assert not found, f"SGLang-internal paths that are not stable across releases: {found}; add them to an adapter"
    assert not moved & STABLE


def _sglang_run(*overrides):
    from top_rl.cli import compose

    return compose(["top.kernels=sglang", "rollout.engine=sglang", "rollout.logprob_source=prefill",
                    "model.path=/models/Qwen3-0.6B", *overrides])


@pytest.mark.parametrize("installed", ["0.5.17", None])
def test_the_dry_run_names_the_contract_and_release_it_runs(monkeypatch, installed):
    from top_rl import cli

    monkeypatch.setattr(sglang_release, "installed_version", lambda python=None: installed)
    plan = cli.launch_plan(_sglang_run(f"top.contract={V17.name}"))
    assert plan["runs"] == {"contract": V17.name, "sglang_release": "0.5.17", "sglang_installed": installed}
    assert plan["top"]["contract"]["release"] == {"sglang": "0.5.17", "status": "proven",
                                                  "numerics": "docs/numerics_0.5.17.md"}
    argv = plan["engines"][0]["argv"]
    assert argv[argv.index("--cuda-graph-backend-prefill") + 1] == "disabled"
    assert "--cuda-graph-max-bs-decode" not in argv or "--cuda-graph-max-bs" not in argv


def test_the_dry_run_refuses_a_contract_of_another_release_than_the_engines(monkeypatch):
    from top_rl import cli

    monkeypatch.setattr(sglang_release, "installed_version", lambda python=None: "0.5.17")
    with pytest.raises(TopConfigError, match=f"sglang 0.5.17 is installed.*top.contract={V17.name}"):
        cli.launch_plan(_sglang_run(f"top.contract={V11.name}"))


def test_the_by_name_check_refuses_what_the_0517_contract_pins():
    """Where the planning interpreter has no (or another) SGLang, extra_args are refused by name: 0.5.17's pinned graph
    and GEMM flags and its new graph switches among them."""
    from top_rl.rollout.sglang import launch as sglang_launch

    refused = sglang_launch._refused_by_name(sglang_engine_config(), V17)
    for flag in ("--cuda-graph-backend-prefill", "--bf16-gemm-backend", "--enforce-piecewise-cuda-graph",
                 "--cuda-graph-backend-decode", "--cuda-graph-config", "--enable-breakable-cuda-graph"):
        assert flag in refused, flag
    assert "--cuda-graph-backend-prefill" not in sglang_launch._refused_by_name(sglang_engine_config(), V11)


def test_the_cpu_install_follows_the_adapters():
    import subprocess

    req = (ROOT / "requirements/sglang-cpu-0.5.17.txt").read_text().splitlines()
    pins = [line.split("#")[0].strip() for line in req if line.strip() and not line.startswith("#")]
    assert pins == ["sglang==0.5.17", *V17.release.cpu_extra_requirements]
    assert "sglang==0.5.11" in (ROOT / "requirements/sglang-cpu.txt").read_text().splitlines()
    out = subprocess.run(["bash", str(ROOT / "scripts/install_sglang_cpu.sh"), "--release", "0.5.12"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "SGLang 0.5.12 has no TOP contract" in out.stderr and "0.5.17" in out.stderr
