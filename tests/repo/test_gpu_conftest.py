"""tests/gpu/conftest.py's kernel plan reaches module-scoped fixtures (issue 30 item 12).

pytest sets up a module fixture before any function-scoped fixture, autouse or not. With the plan installed only per
test, test_native_decode's module-scoped `eager` batch was computed on the process default (the `reference`
kernels) and differed from every `sglang`-kernel call by one bf16 step: three GPU tests failed for that alone. Here
the conftest runs on the CPU as if CUDA were present (only the plan's selection is exercised: no kernel runs)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CONFTEST = """
import torch
torch.cuda.is_available = lambda: True  # as on the H200: the conftest installs the sglang plan
from tests.gpu.conftest import *  # noqa: F401,F403 - its fixtures, as pytest sees them there
"""

MODULE = """
import pytest
from top_rl import kernels

@pytest.fixture(scope="module")
def module_backend():
    return kernels.current_plan().backend

def test_a_module_fixture_computes_under_the_sglang_plan(module_backend):
    assert module_backend == "sglang"

def test_a_test_computes_under_it(module_backend):
    assert kernels.current_plan().backend == "sglang"

def test_what_a_test_changes_in_the_plan_ends_with_it_first():
    from top_rl.kernels.sglang import attention
    attention.set_attention_backend("flashinfer")

def test_what_a_test_changes_in_the_plan_ends_with_it_then():
    assert kernels.current_plan().attention == "triton"
"""


def test_module_fixtures_and_tests_compute_under_the_sglang_plan(tmp_path):
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_plan_scope.py").write_text(MODULE)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly", str(tmp_path)],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "TOP_RL_ATTENTION_BACKEND": "triton"})
    assert proc.returncode == 0 and "4 passed" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-2000:]
