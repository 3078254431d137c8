"""Build DeepGEMM's host extension against this machine's torch and install it as the package `deep_gemm`.

sglang-kernel 0.4.1's binary was built for torch 2.9.1 and does not load under the lent H200's torch 2.11; 0.4.2's
resolves its torch symbols against 2.11 but has not been loaded there yet. So scripts/gpu_bundle.sh packs the engine's
own package (sglang-kernel's
`deep_gemm`: Python, kernel headers, CUTLASS/CuTe) with the host code of the commit it was built from, and this
script compiles the one host-side file, csrc/python_api.cpp, with torch's extension builder, as DeepGEMM's own
setup.py does. The extension's name is the one the package imports (`deep_gemm_cpp` at sgl-kernel's pin, `_C` in
upstream 2.5). Its kernels are compiled at run time by its JIT (nvcc from CUDA_HOME, cache in ~/.deep_gemm) from
the headers installed here, i.e. from the engine's kernel sources.

  python scripts/build_deep_gemm.py SRC.tar.gz SITE_DIR [--prebuilt EXT.so] [--keep OUT_DIR]
--prebuilt: an extension built by an earlier run for the same source and torch (skips the build); --keep: copy the
built extension there as deep_gemm_C.so (to carry it next time).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import time
from pathlib import Path


def _cuda_ldflags(cuda_home: str) -> list[str]:
    """Link the CUDA runtime and NVRTC that torch itself loads (its pip `nvidia` packages) when it has them: a
    second, toolkit copy of libcudart in the process is not the one torch initialised."""
    import glob

    import torch

    site = Path(torch.__file__).parent.parent
    flags = []
    for lib in ("cudart", "nvrtc"):
        found = sorted(glob.glob(str(site / "nvidia" / "**" / f"lib{lib}.so.*[0-9]"), recursive=True))
        if found and os.environ.get("DG_LINK_TOOLKIT_CUDA") != "1":
            d = os.path.dirname(found[0])
            flags += [f"-L{d}", f"-l:{os.path.basename(found[0])}", f"-Wl,-rpath,{d}"]
        else:
            flags += [f"-L{cuda_home}/lib64", f"-l{lib}"]
    flags += [f"-L{cuda_home}/lib64/stubs", "-lcuda"]  # its JIT launches through the driver API (cuLaunchKernelEx)
    flags += _shared_libstdcxx()
    print(f"deep_gemm: link {' '.join(flags)}", flush=True)
    return flags


def _shared_libstdcxx() -> list[str]:
    """Link the shared libstdc++ by its soname. On the lent H200 the compiler finds no `libstdc++.so` dev link and
    silently links `libstdc++.a` into `_C`; that copy's locale state is never set up while the process's other C++
    code (torch) uses the shared one, and the first std::regex / ostream call in `_C` (DeepGEMM's JIT include
    parser) dereferenced a null locale facet: the bf16_gemm segfault. Measured with a SIGSEGV backtrace: frames in
    `std::__detail::_Compiler` under `IncludeParser::get_includes`, and `ldd _C.so` listing no libstdc++."""
    try:
        runtime = subprocess.run(["c++", "-print-file-name=libstdc++.so.6"], capture_output=True,
                                 text=True).stdout.strip()
    except OSError:
        runtime = ""
    if os.path.isabs(runtime) and os.path.exists(runtime):
        return [f"-L{os.path.dirname(runtime)}", "-l:libstdc++.so.6"]
    return ["-l:libstdc++.so.6"]  # the loader's default search path (/lib/x86_64-linux-gnu on Debian/Ubuntu)


def extension_name(src: Path) -> str:
    """The module the package imports its ops from: `from . import NAME` in deep_gemm/__init__.py."""
    m = re.search(r"^from \. import (deep_gemm_cpp|_C)\b", (src / "deep_gemm" / "__init__.py").read_text(), re.MULTILINE)
    if not m:
        raise SystemExit(f"deep_gemm: no `from . import EXT` in {src / 'deep_gemm' / '__init__.py'}")
    return m.group(1)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("src")
    p.add_argument("site")
    p.add_argument("--prebuilt")
    p.add_argument("--keep")
    args = p.parse_args(argv)

    import torch
    from torch.utils import cpp_extension

    t0 = time.time()
    work = Path("/tmp/top_rl_deep_gemm")
    shutil.rmtree(work, ignore_errors=True)
    (work / "src").mkdir(parents=True)
    with tarfile.open(args.src) as tar:
        tar.extractall(work / "src", filter="data")
    src = work / "src"
    rev = (src / "REVISION").read_text().strip()
    pkg = Path(args.site) / "deep_gemm"
    shutil.rmtree(pkg, ignore_errors=True)
    shutil.copytree(src / "deep_gemm", pkg)  # the Python package and include/ (its JIT's headers)
    shutil.copy(src / "REVISION", pkg / "REVISION")  # the host code's commit, checked by top_rl/kernels/sglang/deep_gemm_source.py
    ext = extension_name(src)
    so_name = ext + sysconfig.get_config_var("EXT_SUFFIX")
    stamp = f"deep_gemm {rev} {ext} torch {torch.__version__} cuda {torch.version.cuda} shared-libstdc++ libcuda"

    if args.prebuilt and Path(args.prebuilt).exists() and Path(args.prebuilt + ".stamp").exists() \
            and Path(args.prebuilt + ".stamp").read_text().strip() == stamp:
        shutil.copy(args.prebuilt, pkg / so_name)
        print(f"deep_gemm: prebuilt {ext} for {stamp}", flush=True)
        return 0

    cuda_home = cpp_extension.CUDA_HOME
    print(f"deep_gemm: building {stamp}, CUDA_HOME={cuda_home}", flush=True)
    build = work / "build"
    build.mkdir()
    os.environ.setdefault("MAX_JOBS", str(os.cpu_count() or 8))
    cpp_extension.load(
        name=ext,
        sources=[str(src / "csrc" / "python_api.cpp")],
        extra_include_paths=[f"{cuda_home}/include", f"{cuda_home}/include/cccl", str(src / "deep_gemm" / "include"),
                             str(src / "third-party" / "fmt" / "include")],
        extra_cflags=["-O3", "-Wno-psabi", "-Wno-deprecated-declarations"],
        extra_ldflags=_cuda_ldflags(cuda_home),
        build_directory=str(build), with_cuda=True, is_python_module=False, verbose=False)
    built = next(build.glob(f"{ext}*.so"))
    try:
        linked = subprocess.run(["ldd", str(built)], capture_output=True, text=True).stdout
    except OSError:
        linked = None  # no ldd here: nothing to check with
    if linked is not None and "libstdc++" not in linked:
        raise SystemExit(f"deep_gemm: {ext} does not link the shared libstdc++, so its first JIT call would crash "
                         f"(a static copy's locale is never initialised); not installed, not kept. ldd:\n{linked}")
    shutil.copy(built, pkg / so_name)
    print(f"deep_gemm: built in {time.time() - t0:.0f} s -> {pkg / so_name}", flush=True)
    if args.keep:
        Path(args.keep).mkdir(parents=True, exist_ok=True)
        shutil.copy(built, Path(args.keep) / "deep_gemm_C.so")
        (Path(args.keep) / "deep_gemm_C.so.stamp").write_text(stamp + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
