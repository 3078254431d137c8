"""The TOP contract's engine environment in this process: SGLang reads its GEMM path and determinism switches from the
environment once, when its modules are imported, so they are pinned here (to the installed KernelPlan's contract)
before any SGLang kernel is loaded, and a process whose SGLang runs another GEMM than the contract names is refused."""

from __future__ import annotations

import os

from top_rl import contract as _contract
from top_rl.kernels import plan as _plan

loaded_under: str | None = None  # the contract SGLang's kernels were loaded under in this process (fixed from then on)


def active_contract() -> _contract.TopContract:
    """The contract of the installed KernelPlan."""
    return _contract.get(_plan.current().contract)


def check_plan(plan: _plan.KernelPlan) -> None:
    """Refuse a plan whose contract differs from the one SGLang's kernels were already loaded under."""
    if loaded_under is not None and plan.contract != loaded_under:
        raise RuntimeError(f"SGLang's kernels were already loaded under contract {loaded_under!r} (its GEMM path is "
                           f"fixed at import); install the plan before the first kernel call")


def pin_engine_env(top: _contract.TopContract | None = None) -> None:
    """Set the contract's engine env (its GEMM path, determinism) before SGLang reads it at import; refuse a clash."""
    top = top or active_contract()
    for key, want in top.engine_env:
        have = os.environ.get(key)
        if have is not None and not _contract.same_env_value(have, want):
            raise RuntimeError(f"{key}={have!r} in the trainer's environment, but the TOP contract {top.name!r} "
                               f"(gemm={top.gemm!r}) pins {want!r} on both sides: unset it")
        os.environ[key] = want
    for key in top.forbidden_env:
        if os.environ.get(key):
            raise RuntimeError(f"{key} is set; the TOP contract forbids it on both sides")


def check_gemm_path(top: _contract.TopContract, deepgemm_active: bool) -> None:
    """Refuse a process whose SGLang mm_BI would run another GEMM than the contract names (the engine runs the
    contract's: its launch env comes from the same contract)."""
    if top.gemm == "deepgemm" and not deepgemm_active:
        raise RuntimeError(
            f"contract {top.name!r} names gemm='deepgemm', but SGLang's batch-invariant mm runs its Triton kernel in "
            "this process (deep_gemm not importable, a GPU below sm90, or DeepGEMM switched off in the env): install a "
            f"deep_gemm built for this torch, or use a contract on the Triton GEMM: "
            f"{', '.join(_contract.with_gemm(top, 'triton_persistent'))}")
    if top.gemm != "deepgemm" and deepgemm_active:
        raise RuntimeError(
            f"sglang.srt.batch_invariant_ops was imported with DeepGEMM on, but contract {top.name!r} names "
            f"gemm={top.gemm!r}: import top_rl.kernels.sglang.backend (or call pin_engine_env()) before importing sglang")
