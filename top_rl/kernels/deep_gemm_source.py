"""Which DeepGEMM kernels a process would run: a digest of the headers its JIT compiles them from.

DeepGEMM compiles every kernel at run time from the headers under `deep_gemm/include` (its own, CUTLASS's and
CuTe's), with block sizes chosen by its host code. The engine's are those of sglang-kernel 0.4.1 (what sglang
0.5.10.post1 pins); the trainer's package is built from the same files (scripts/gpu_bundle.sh deep_gemm checks that
the host code's commit has the wheel's package, file for file). The digest below is what the contract pins
(top_rl/contract.py, DEEPGEMM_SOURCE), so a trainer with another DeepGEMM is refused before it computes a bit.
"""

from __future__ import annotations

import hashlib
from pathlib import Path


def include_digest(package_dir: str | Path) -> str:
    """sha256 over (relative path, sha256 of content) of every file under PACKAGE_DIR/include, in path order."""
    root = Path(package_dir) / "include"
    if not root.is_dir():
        raise FileNotFoundError(f"{root}: no include/ directory (not a DeepGEMM package with JIT headers)")
    h = hashlib.sha256()
    for p in sorted(q for q in root.rglob("*") if q.is_file() and "__pycache__" not in q.parts):
        h.update(p.relative_to(root).as_posix().encode() + b"\0")
        h.update(hashlib.sha256(p.read_bytes()).digest())
    return h.hexdigest()


def check(module, want: str, source: str) -> None:
    """Refuse a `deep_gemm` module whose JIT headers are not the contract's (`source` names where they come from)."""
    have = include_digest(Path(module.__file__).parent)
    if have != want:
        raise RuntimeError(
            f"deep_gemm at {Path(module.__file__).parent} compiles its kernels from other headers than the engine's "
            f"({source}): include/ digest {have[:16]}..., the contract pins {want[:16]}.... Install the engine's: "
            "scripts/gpu_bundle.sh deep_gemm, then scripts/build_deep_gemm.py on the GPU machine (scripts/gpu_run.sh "
            "does both when .gpu_bundle/deep_gemm is carried)")
