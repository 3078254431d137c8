"""(b) SGLang's batch-invariant GEMM (mm_BI, the Triton persistent kernel) vs cuBLAS on Qwen3-0.6B's GEMM
shapes, bf16, in TFLOP/s (median of triton.testing.do_bench), plus SGLang's DeepGEMM path of mm_BI where
`deep_gemm` imports. Run on the GPU: python bench/gemm.py"""

from __future__ import annotations

import sys

import torch
import triton

sys.path.insert(0, __file__.rsplit("/bench/", 1)[0])
from bench._util import table  # noqa: E402
from top_rl.kernels.sglang import backend as sg  # noqa: E402

H, F, HQ, HKV, D, V = 1024, 3072, 16, 8, 128, 151936
SHAPES = {"qkv": (HQ * D + 2 * HKV * D, H), "o_proj": (H, HQ * D), "gate_up": (2 * F, H), "down": (H, F),
          "lm_head": (V, H), "square 4096": (4096, 4096)}


def deepgemm_mm():
    """SGLang's DeepGEMM path of mm_BI (deep_gemm.bf16_gemm_nn, contract gemm='deepgemm'), or (None, why not)."""
    try:
        import deep_gemm  # noqa: F401 - an ABI mismatch raises OSError here

        sg.pin_engine_env()
        from sglang.srt.batch_invariant_ops import batch_invariant_ops as bio

        if not bio.ENABLE_JIT_DEEPGEMM:
            return None, "SGLang's configurer turned JIT DeepGEMM off"
        return (lambda x, w: bio._matmul_persistent_deepgemm(x, w.t())), None
    except Exception as e:  # noqa: BLE001 - reported under the table
        return None, f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"


def main():
    rows = []
    dg, why = deepgemm_mm()
    for m in (4096, 16384):
        for name, (n, k) in SHAPES.items():
            x = torch.randn(m, k, device="cuda").bfloat16()
            w = (torch.randn(n, k, device="cuda") * 0.02).bfloat16()
            flop = 2 * m * n * k
            t_bi = triton.testing.do_bench(lambda: sg.mm_bi(x, w), warmup=25, rep=100, return_mode="median")
            t_cb = triton.testing.do_bench(lambda: torch.nn.functional.linear(x, w), warmup=25, rep=100, return_mode="median")
            tf_bi, tf_cb = flop / t_bi / 1e9, flop / t_cb / 1e9
            tf_dg = "-"
            if dg is not None:
                tf_dg = flop / triton.testing.do_bench(lambda: dg(x, w), warmup=25, rep=100, return_mode="median") / 1e9
            rows.append([m, name, n, k, tf_bi, tf_dg, tf_cb, tf_cb / tf_bi])
            del x, w
    print(table("GEMM bf16: mm_BI (SGLang persistent Triton), DeepGEMM bf16_gemm_nn, cuBLAS, TFLOP/s",
                ["M", "layer", "N", "K", "mm_BI", "DeepGEMM", "cuBLAS", "cuBLAS/mm_BI"], rows))
    if dg is None:
        print(f"DeepGEMM: not measured ({why})")


if __name__ == "__main__":
    main()
