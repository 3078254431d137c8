"""Which DeepGEMM kernels a process would run: a digest of the sources its JIT compiles them from.

DeepGEMM compiles every kernel at run time from the headers under `deep_gemm/include` (its own, CUTLASS's and
CuTe's), driven by its Python package and by block-size heuristics in its compiled host extension. The engine's
package is sglang-kernel 0.4.2's (what sglang 0.5.11 pins; file for file 0.4.1's); the trainer's is built from the same files
(scripts/gpu_bundle.sh deep_gemm checks that the host code's commit has the wheel's package, file for file).
The contract pins (top_rl/contract.py, DEEPGEMM_SOURCE) the digest of the headers and Python files, and the commit
of the host code, which scripts/build_deep_gemm.py records in the package it installs (REVISION). What no check
here covers: a host extension built from other code without that record (the engine's own wheel has none), and
the nvcc that compiles the kernels at run time.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

REVISION_FILE = "REVISION"  # written by scripts/build_deep_gemm.py: "<DeepGEMM commit> <where the package came from>"


def package_digest(package_dir: str | Path) -> str:
    """sha256 over (relative path, sha256 of content) of every file under include/ and every .py file of the
    package, in path order (not the compiled extension, caches or the REVISION record)."""
    root = Path(package_dir)
    if not (root / "include").is_dir():
        raise FileNotFoundError(f"{root / 'include'}: no include/ directory (not a DeepGEMM package with JIT headers)")
    files = [q for q in root.rglob("*") if q.is_file() and "__pycache__" not in q.parts
             and (q.relative_to(root).parts[0] == "include" or q.suffix == ".py")]
    h = hashlib.sha256()
    for p in sorted(files, key=lambda q: q.relative_to(root).as_posix()):
        h.update(p.relative_to(root).as_posix().encode() + b"\0")
        h.update(hashlib.sha256(p.read_bytes()).digest())
    return h.hexdigest()


def check(module, want_digest: str, want_rev: str, source: str) -> None:
    """Refuse a `deep_gemm` module whose sources are not the contract's (`source` names where they come from), or
    whose recorded host-code commit is another."""
    pkg = Path(module.__file__).parent
    fix = ("Install the engine's: scripts/gpu_bundle.sh deep_gemm, then scripts/build_deep_gemm.py on the GPU "
           "machine (scripts/gpu_run.sh does both when .gpu_bundle/deep_gemm is carried)")
    have = package_digest(pkg)
    if have != want_digest:
        raise RuntimeError(f"deep_gemm at {pkg} compiles its kernels from other sources than the engine's ({source}): "
                           f"digest {have[:16]}..., the contract pins {want_digest[:16]}.... {fix}")
    record = pkg / REVISION_FILE
    if record.exists() and not record.read_text().startswith(want_rev):
        raise RuntimeError(f"deep_gemm at {pkg} was built from DeepGEMM {record.read_text().split()[0][:12]}, the "
                           f"engine's ({source}) from {want_rev[:12]}. {fix}")
