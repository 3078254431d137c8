"""GPU tests (run on a lent H200 by scripts/gpu_run.sh): the `sglang` kernel backend end to end.

Every module is skipped on a machine without CUDA. The attention kernel is the one named by
TOP_RL_ATTENTION_BACKEND (default here: triton, the backend the lent GPU can import).
"""

from __future__ import annotations

import os

import pytest
import torch

from top_rl import kernels


@pytest.fixture(autouse=True)
def sglang_backend():
    if not torch.cuda.is_available():
        yield
        return
    from top_rl.kernels import plan

    with kernels.use_plan(plan.build("sglang", attention=os.environ.get(plan.ATTENTION_ENV, "triton"))):
        yield
