"""`top-rl doctor` (top_rl/tools/doctor.py): the rules on stand-in facts (a good H100 stack, then one fault at a time,
each named with its fix), and the command itself on this CPU machine: in seconds, without Ray or torch imported,
naming what is missing."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time

import pytest

from top_rl import contract
from top_rl.tools import doctor

C11, C17, DG = (contract.QWEN3_DENSE_TOP_V1, contract.QWEN3_DENSE_TOP_V1_SGLANG_0_5_17,
                contract.QWEN3_DENSE_TOP_V1_DEEPGEMM)


def good(top=C11) -> doctor.Facts:
    versions = {"sglang": top.sglang_version, "megatron-core": "0.19.2", **dict(top.release.gpu_pins)}
    versions["torch"] += "+cu128"
    return doctor.Facts(python=(3, 12), versions=versions, torch_cuda="12.8",
                        gpus=[("NVIDIA H100 80GB HBM3", "9.0", "570.124.06")])


def failing(checks) -> dict[str, str]:
    return {c.name: c.line for c in checks if not c.ok and not c.warn}


@pytest.mark.parametrize("top", [C11, C17, DG], ids=lambda c: c.name)
def test_the_pinned_stack_on_a_hopper_gpu_passes(top):
    checks = doctor.diagnose(good(top), top)
    assert not failing(checks) and not [c for c in checks if c.warn]
    assert {"sglang", "torch", "sglang-kernel", "flashinfer-python", "megatron-core", "GPU 0", "GPU 0 driver"} <= {
        c.name for c in checks}


def test_each_mismatch_is_named_with_its_fix():
    facts = good()
    facts.versions.update(torch="2.13.0+cu130", **{"sglang-kernel": None})
    bad = failing(doctor.diagnose(facts, C11))
    assert set(bad) == {"torch", "sglang-kernel"}
    assert bad["torch"] == ("found 2.13.0+cu130, SGLang 0.5.11 pins 2.11.0; "
                            "fix: pip install -e '.[sglang0511]' in the TOP-RL checkout (README, GPU install)")
    assert bad["sglang-kernel"].startswith("not installed, SGLang 0.5.11 pins 0.4.2; fix: pip install -e '.[sglang0511]'")


def test_another_release_than_the_contracts_is_named():
    facts = good(C17)
    bad = failing(doctor.diagnose(facts, C11))
    assert bad["sglang"].startswith("found 0.5.17, contract qwen3_dense_top_v1 is SGLang 0.5.11")
    assert "sglang-kernel" in bad and "0.4.5" in bad["sglang-kernel"] and "0.4.2" in bad["sglang-kernel"]


def test_gpu_arch_and_driver_rules():
    old = dataclasses.replace(good(), gpus=[("Tesla T4", "7.5", "570.1")])
    assert failing(doctor.diagnose(old, C11))["GPU 0"].startswith("Tesla T4 is sm75; the contract's kernels need sm80")
    ampere = dataclasses.replace(good(), gpus=[("NVIDIA A100", "8.0", "570.1")])
    checks = doctor.diagnose(ampere, C11)
    assert not failing(checks) and [c.name for c in checks if c.warn] == ["GPU 0"]  # runs, unproven: a warning
    assert "top.contract=qwen3_dense_top_v1" in failing(doctor.diagnose(ampere, DG))["GPU 0"]  # DeepGEMM is sm90 only
    stale = dataclasses.replace(good(), torch_cuda="13.0", gpus=[("NVIDIA H100", "9.0", "570.124.06")])
    assert failing(doctor.diagnose(stale, C11))["GPU 0 driver"] == (
        "570.124.06 is older than 580.65.06, the minimum for torch's CUDA 13.0; fix: update the NVIDIA driver to >= "
        "580.65.06")


def test_cpu_machine_names_what_is_missing():
    facts = doctor.Facts(python=(3, 12), versions={"sglang": None, "torch": "2.13.0+cpu", "megatron-core": "0.19.2"},
                         torch_cuda=None, gpu_error="nvidia-smi not found (no NVIDIA driver on this machine)")
    bad = failing(doctor.diagnose(facts, C11))
    assert {"sglang", "torch", "sglang-kernel", "flashinfer-python", "torch CUDA build", "GPU"} <= set(bad)
    assert bad["GPU"].startswith("none: nvidia-smi not found")
    assert "is a CPU build" in bad["torch CUDA build"]


def test_doctor_command_on_this_machine_is_fast_and_starts_nothing():
    """The console entry: no Ray, no torch import, a few seconds; on this CPU machine it fails, naming the GPU."""
    probe = ("import sys; sys.argv = ['top-rl', 'doctor']; import top_rl.cli as c\n"
             "try:\n    c.main()\nexcept SystemExit as e:\n"
             "    print('EXIT', e.code, sorted(m for m in ('ray', 'torch', 'megatron') if m in sys.modules))")
    t = time.monotonic()
    res = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PATH": "/usr/bin:/bin"})  # no nvidia-smi on this PATH
    assert time.monotonic() - t < 30, "doctor must answer in seconds"
    assert res.stdout.strip().splitlines()[-1] == "EXIT 1 []", res.stdout + res.stderr
    assert "FAIL  GPU: none: nvidia-smi not found" in res.stdout
    assert "top-rl doctor: contract " in res.stdout.splitlines()[0]


def test_doctor_refuses_an_unknown_contract(capsys):
    assert doctor.main(["contract=nope"]) == 2
    assert "top-rl doctor: contract='nope': expected one of qwen3_dense_top_v1" in capsys.readouterr().err
