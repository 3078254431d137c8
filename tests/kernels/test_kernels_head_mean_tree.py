"""`_head_mean` (top_rl/kernels/sglang/fused_triton.py) must add each row of 128 exactly as SGLang's mean_BI
(`mean_kernel`, one program per row, one 1024-wide block) does. Both kernels are compiled here for sm_90 (no GPU
needed: Triton's NVIDIA backend lowers to LLVM IR on CPU), with the specialisation each launch gets, and the
structure that decides the bits is compared: the register layout of the loaded block, the within-thread additions
before the first shuffle, the lane butterfly, and the division. Bit patterns on the GPU:
tests/gpu/test_fused_forward.py::test_head_mean_bits_equal_mean_bi."""

from __future__ import annotations

import re

import pytest

triton = pytest.importorskip("triton")

D16 = [["tt.divisibility", 16]]


def _sm90_compiler_missing() -> str | None:
    """Why this Triton cannot compile for sm_90 without a GPU (then the module skips), or None. Any other
    compile error is a failure."""
    from triton.backends import backends

    if "nvidia" not in backends:
        return f"Triton {triton.__version__} has no NVIDIA backend here (backends: {sorted(backends)})"
    from triton import knobs

    try:
        knobs.nvidia.ptxas.path  # the last stage (PTX -> cubin) runs ptxas even though only the IR is read
    except RuntimeError as e:  # "Cannot find ptxas": neither TRITON_PTXAS_PATH nor Triton's bundled binary
        return f"Triton's NVIDIA backend finds no ptxas: {e}"
    return None


_MISSING = _sm90_compiler_missing()
pytestmark = pytest.mark.skipif(_MISSING is not None, reason=_MISSING or "")


def _compile(fn, signature, constexprs, attrs):
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    k = triton.compile(ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs),
                       target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
    return k.asm["ttgir"], k.asm["llir"]


@pytest.fixture(scope="module")
def mean_bi():
    from tests.sglang_cpu import import_error

    if import_error():
        pytest.skip(import_error())
    from sglang.srt.batch_invariant_ops import batch_invariant_ops as bio

    # mean_dim(sq [M, 128] fp32, -1, keepdim=True): strides (128, 1, 1), output strides (1, 1), K = 1; Triton
    # specialises the ints equal to 1 as constants and marks the multiples of 16
    sig = {"input_ptr": "*fp32", "output_ptr": "*fp32", "input_stride0": "i32", "input_stride1": "constexpr",
           "input_stride2": "constexpr", "output_stride0": "constexpr", "output_stride1": "constexpr", "M": "i32",
           "N": "i32", "K": "constexpr", "BLOCK_SIZE": "constexpr"}
    cx = {"input_stride1": 1, "input_stride2": 1, "output_stride0": 1, "output_stride1": 1, "K": 1, "BLOCK_SIZE": 1024}
    return _compile(bio.mean_kernel, sig, cx, {(0,): D16, (1,): D16, (2,): D16, (7,): D16, (8,): D16})


@pytest.fixture(scope="module")
def head_mean():
    from top_rl.kernels.sglang import fused_triton as ft

    sig = {"x_ptr": "*fp32", "out_ptr": "*fp32", "n_rows": "i32", "N": "i32", "ROWS": "constexpr", "D": "constexpr"}
    return _compile(ft._head_mean, sig, {"ROWS": ft.HEAD_ROWS, "D": ft.HEAD_DIM}, {(0,): D16, (1,): D16, (3,): D16})


def _layout(ttgir):
    return re.search(r"#blocked = #ttg\.blocked<\{([^}]*)\}>", ttgir).group(1)


def _shuffles(llir):
    return [int(m) for m in re.findall(r"shfl\.sync\.bfly\.i32\(i32 -1, i32 %\w+, i32 (\d+), i32 31\)", llir)]


def _adds_before_first_shuffle(llir):
    body = llir[:llir.index("shfl.sync.bfly")]
    return len(re.findall(r"= fadd float", body))


def test_the_loaded_block_has_mean_bis_per_row_layout(mean_bi, head_mean):
    assert _layout(mean_bi[0]) == "sizePerThread = [4], threadsPerWarp = [32], warpsPerCTA = [4], order = [0]"
    assert _layout(head_mean[0]) == ("sizePerThread = [1, 4], threadsPerWarp = [1, 32], warpsPerCTA = [4, 1], "
                                     "order = [1, 0]")


def test_each_row_is_added_in_mean_bis_order(mean_bi, head_mean):
    from top_rl.kernels.sglang import fused_triton as ft

    # mean_BI: 8 registers per thread (the row's 4, then 4 masked zeros) in one chain, the 32-lane butterfly, then
    # the 4 warps (the zeros of warps 1-3); `_head_mean`: per row the same 4-register chain and the same butterfly.
    assert _adds_before_first_shuffle(mean_bi[1]) == 7
    assert _shuffles(mean_bi[1]) == [16, 8, 4, 2, 1, 2, 1]
    rows_per_thread = ft.HEAD_ROWS // 4
    assert _adds_before_first_shuffle(head_mean[1]) == 3 * rows_per_thread
    assert _shuffles(head_mean[1]) == [16, 8, 4, 2, 1] * rows_per_thread


def test_both_divide_the_sum_by_n_alike(mean_bi, head_mean):
    for _, llir in (mean_bi, head_mean):
        assert "sitofp i32" in llir and "@llvm.nvvm.div.full(float" in llir
