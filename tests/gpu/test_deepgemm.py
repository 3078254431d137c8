"""DeepGEMM's bf16_gemm_nn as SGLang 0.5.11 calls it for its batch-invariant mm (contract gemm='deepgemm'):
batch invariance at 1..4096 rows with torch.equal on every Qwen3-0.6B GEMM shape, and closeness to cuBLAS.

Skipped where `deep_gemm` does not import: on the lent H200 (torch 2.11) no published build loads (sgl-deep-gemm
0.2.x's _C.so needs c10::cuda::CUDAErrorLogCapture, which torch 2.11 does not export; PyPI has no sdist to rebuild).
The engine's own package (sglang-kernel's deep_gemm, packed by `scripts/gpu_bundle.sh deep_gemm`, its host
extension built there by scripts/build_deep_gemm.py against the shared libstdc++) imports and runs (5/5 on the H200). Its first GEMM still runs in a subprocess first, so a crash
fails these tests with its signal instead of killing pytest.
"""

from __future__ import annotations

import functools
import subprocess
import sys

import pytest
import torch

from tests.gpu._common import needs_cuda
from tests.gpu.test_invariance import BATCHES, GEMMS, _batch

try:  # an ABI mismatch raises OSError from torch.ops.load_library, not ImportError
    import deep_gemm  # noqa: F401

    _WHY = None
except Exception as e:  # noqa: BLE001
    _WHY = f"deep_gemm does not import here: {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"

pytestmark = [needs_cuda, pytest.mark.gpu, pytest.mark.skipif(_WHY is not None, reason=_WHY or "")]

_PROBE = """
import torch, deep_gemm
a = torch.randn(256, 1024, device="cuda").bfloat16()
w = torch.randn(1024, 1024, device="cuda").bfloat16()
out = torch.empty(256, 1024, device="cuda", dtype=torch.bfloat16)
deep_gemm.bf16_gemm_nn(a, w.t(), out)
torch.cuda.synchronize()
"""


@functools.cache
def _probe() -> str | None:
    """None when one bf16_gemm_nn runs in a fresh process; else what happened (a crash would kill pytest)."""
    proc = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=600)
    if proc.returncode == 0:
        return None
    how = f"signal {-proc.returncode}" if proc.returncode < 0 else f"exit code {proc.returncode}"
    return f"deep_gemm.bf16_gemm_nn crashed in a subprocess probe ({how}): {proc.stderr.strip()[-600:]}"


@pytest.fixture(autouse=True)
def _deepgemm_runs():
    why = _probe()
    if why:
        pytest.fail(why)


def _deepgemm_mm(x, w):
    """x[M, K] @ w[N, K].T exactly as SGLang's matmul_persistent hands it to DeepGEMM (a contiguous, b = W.t())."""
    from top_rl.kernels.sglang.backend import pin_engine_env

    pin_engine_env()
    from sglang.srt.batch_invariant_ops import batch_invariant_ops as bio

    if not bio.ENABLE_JIT_DEEPGEMM:
        pytest.skip("SGLang's configurer turned JIT DeepGEMM off in this process (SGLANG_ENABLE_JIT_DEEPGEMM / sm<90)")
    return bio._matmul_persistent_deepgemm(x.contiguous(), w.t())


@pytest.mark.parametrize("k,n", GEMMS, ids=lambda x: str(x))
def test_bf16_gemm_nn_is_batch_invariant(k, n):
    w = (torch.randn(n, k, device="cuda") * 0.02).bfloat16()
    target = torch.randn(1, k, device="cuda").bfloat16()
    alone = _deepgemm_mm(target, w)
    ref = torch.nn.functional.linear(target.float(), w.float())
    assert (alone.float() - ref).abs().max() < 1e-2 * ref.abs().max().clamp_min(1.0)  # a correct GEMM at all
    for b in BATCHES:
        rows, at = _batch(target, b, seed=2000 + b)
        assert torch.equal(_deepgemm_mm(rows, w)[at], alone[0]), f"row changed at batch size {b}"
