"""bench/trainer_step.py's acceptance table: the wall-clock TOP/stock ratio and, where both steps were profiled, the
GPU-busy ratio (the steadier one), from the workers' records."""

from __future__ import annotations

from types import SimpleNamespace

from bench._trainer_report import Report


def _result(impl, recompute, step_ms):
    return {"model": "m", "impl": impl, "recompute": recompute, "mbt": 16384, "micro_batches": 1, "status": "ok",
            "step_ms": step_ms, "tokens_per_s": 16384e3 / step_ms, "tflops": 100.0, "mfu": 0.2, "peak_gib": 1.0}


def _profile(impl, recompute, busy_ms):
    return {"model": "m", "impl": impl, "recompute": recompute, "mbt": 16384, "wall_ms": 500.0, "busy_ms": busy_ms,
            "families": {"GEMM fwd": 10.0}, "top_kernels": []}


def _row(text, recompute):
    return next(line for line in text.splitlines() if line.startswith("|") and f"| {recompute:>9} |" in line)


def test_ratio_table_has_wall_clock_and_gpu_busy_ratios():
    rep = Report(SimpleNamespace(models="m"))
    for impl, ms in (("top", 440.0), ("stock", 400.0)):
        rep.add("RESULT", _result(impl, True, ms))
        rep.add("RESULT", _result(impl, False, ms - 100))
    rep.add("RESULT", _result("top_flash_rc", True, 420.0))  # top.fast_paths.recompute_attention: recompute on only
    rep.add("RESULT", _result("top_cublas_rc", True, 380.0))  # top.fast_paths.recompute_gemm: recompute on only
    rep.add("PROFILE", _profile("top", True, 360.0))
    rep.add("PROFILE", _profile("stock", True, 300.0))
    text = rep.ratio_table()
    cells = [c.strip() for c in _row(text, "on").split("|")[1:-1]]
    # TOP ms, stock ms, wall ratio, busy ratio, flash recompute / stock, cuBLAS recompute / stock
    assert cells[3:9] == ["440.0", "400.0", "1.10", "1.20", "1.05", "0.95"]
    cells = [c.strip() for c in _row(text, "off").split("|")[1:-1]]
    assert cells[5:9] == ["1.13", "-", "-", "-"]  # no profile and no recompute fast-path rows with recompute off
