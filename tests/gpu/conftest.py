"""GPU tests (run on a lent H200 by scripts/gpu_run.sh): the `sglang` kernel backend end to end.

Every module is skipped on a machine without CUDA. The attention kernel is the one named by
TOP_RL_ATTENTION_BACKEND (default here: triton, the backend the lent GPU can import).
"""

from __future__ import annotations

import os

import pytest
import torch

from top_rl import kernels


@pytest.fixture(scope="session", autouse=True)
def sglang_plan():
    """The `sglang` KernelPlan for the whole session. Session-scoped so that module-scoped fixtures compute under it
    too: pytest sets up a module fixture before any function-scoped one, so with only the per-test fixture below a
    module fixture ran on the process default (the `reference` kernels). That was issue 30 item 12:
    test_native_decode's module-scoped `eager` batch came from the reference kernels and differed from every
    sglang-kernel call by one bf16 step at a few positions (H200, sessions 7-13)."""
    if not torch.cuda.is_available():
        yield None
        return
    from top_rl.kernels import plan

    built = plan.build("sglang", attention=os.environ.get(plan.ATTENTION_ENV, "triton"))
    with kernels.use_plan(built):
        yield built


@pytest.fixture(autouse=True)
def sglang_backend(sglang_plan):
    """The session's plan again for each test, so what a test changes in it (set_attention_backend) ends with it."""
    if sglang_plan is None:
        yield
        return
    with kernels.use_plan(sglang_plan):
        yield
