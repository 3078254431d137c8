#!/usr/bin/env bash
# Download the wheels the lent GPU machine lacks into .gpu_bundle/GROUP/ (git-ignored), for
# `run(carry=[".gpu_bundle/core", ...])`. That machine has no network; it has Python 3.12, torch 2.11 (cu130),
# triton 3.6 and transformers (so numpy, safetensors, tokenizers, PyYAML, httpx, requests, tqdm, aiohttp, click,
# msgpack, protobuf too). One call carries at most 64 MiB (working tree included), so the wheels come in groups:
#   core        the pinned SGLang wheel (installed there without its dependencies: sglang-kernel and its torch
#               pin cannot be carried), the pure-Python packages `import sglang.srt...` needs, Megatron-core,
#               Hydra/OmegaConf for top_rl's configs                                          (~22 MiB)
#   ray         Ray 2.60.0 slimmed (no jars, rllib, serve, data, llm, tune, train, dashboard UI) + jsonschema
#               and friends: the GPU job (`scripts/gpu_run.sh e2e`)                           (~38 MiB)
#   flashinfer  flashinfer-python (JIT-compiles on the device) + apache-tvm-ffi + cuda-tile   (~12 MiB)
#   sglang_ref  what SGLang's own Qwen3ForCausalLM imports beyond core (tests/gpu/test_sglang_reference.py)
#   deep_gemm   the engine's DeepGEMM, to be built on the device against its torch by scripts/build_deep_gemm.py (no
#               published build loads under torch 2.11): the `deep_gemm` package of sglang-kernel 0.4.1 (what sglang
#               0.5.10.post1 pins; its kernel headers and the CUTLASS/CuTe its JIT compiles with) without its binary,
#               the host code (csrc) of sgl-project/DeepGEMM at $DEEPGEMM_REV (sgl-kernel's pin; its Python package must
#               equal the wheel's, file for file, or nothing is packed) and fmt's headers, as one tarball. Sources: git
#               clones, or offline DEEPGEMM_GIT_DIR / FMT_GIT_DIR (git dirs holding those commits); the 352 MB wheel is
#               cached in $SGLANG_KERNEL_CACHE                                                (~4 MiB)
# Usage: bash scripts/gpu_bundle.sh [GROUP ...]   (default: core). gpu_run.sh installs every carried group.
set -euo pipefail
cd "$(dirname "$0")/.."

PY="${PYTHON:-python3}"
[ -x .venv/bin/python ] && PY="${PYTHON:-.venv/bin/python}"
ROOT=.gpu_bundle
MAX_MIB=62  # what the named groups may add up to (64 MiB per call, the working tree included)

CORE=(
  sglang==0.5.10.post1
  megatron-core==0.19.2
  # sglang import chain (sglang.utils, sglang.lang, sglang.srt.utils, server_args)
  ipython==9.18.1 ipython-pygments-lexers==1.1.1 jedi==0.20.1 parso==0.8.7 matplotlib-inline==0.2.2
  pexpect==4.9.0 ptyprocess==0.7.0 prompt-toolkit==3.0.53 wcwidth==0.9.4 stack-data==0.6.3
  executing==2.3.0 asttokens==3.0.2 pure-eval==0.2.4 traitlets==5.16.1 pygments==2.21.0
  pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5
  typing-extensions==4.16.0   # pydantic 2.14 needs >=4.16; the image's may be older
  orjson==3.13.0 pybase64==1.5.1 starlette==1.10.0 anyio==4.16.0
  openai==2.6.1 jiter==0.19.0 distro==1.9.0 sniffio==1.3.1
  pyzmq==27.3.0 partial-json-parser==0.2.1.1.post7 dill==0.4.1 psutil==7.2.2
  # top_rl configs
  hydra-core==1.3.8 omegaconf==2.3.1
)
RAY=(ray==2.60.0 jsonschema==4.25.1 referencing==0.36.2 jsonschema-specifications==2025.9.1 rpds-py==0.27.1)
RAY_DROP=(ray/jars ray/rllib ray/serve ray/data ray/llm ray/tune ray/train ray/dashboard/client/build)
FLASHINFER=(flashinfer-python==0.6.7.post3 apache-tvm-ffi==0.1.15.post2 cuda-tile==1.7.0)
SGLANG_REF=(compressed-tensors==0.20.1 loguru==0.7.3 msgspec==0.22.0 gguf==0.19.0 einops==0.8.2)  # SGLang's Qwen3 (+einops: insurance)

SGLANG_KERNEL=${SGLANG_KERNEL:-sglang-kernel==0.4.1}  # sglang 0.5.10.post1's Requires-Dist: the engine's deep_gemm
SGLANG_KERNEL_CACHE=${SGLANG_KERNEL_CACHE:-$HOME/.cache/top_rl/wheels}
DEEPGEMM_REPO=${DEEPGEMM_REPO:-https://github.com/sgl-project/DeepGEMM}
DEEPGEMM_REV=${DEEPGEMM_REV:-ffe2b6b97420a9f8c58268ca55755168e6e2f360}  # sgl-kernel's FetchContent pin (sgl-release tip)
FMT_REPO=${FMT_REPO:-https://github.com/fmtlib/fmt}
FMT_REV=${FMT_REV:-553ec11ec06fbe0beebfbb45f9dc3c9eabd83d28}  # DeepGEMM's submodule at that commit

git_export() {  # git_export GIT_DIR_OR_EMPTY REPO REV DEST PATH...: the PATHs of REV, from a local git dir or a clone
  local gd=$1 repo=$2 rev=$3 dest=$4; shift 4
  mkdir -p "$dest"
  if [ -z "$gd" ]; then
    git clone -q --bare "$repo" "$dest.clone.git"
    git --git-dir="$dest.clone.git" archive "$rev" "$@" | tar -x -C "$dest"
    rm -rf "$dest.clone.git"
  else
    git --git-dir="$gd" archive "$rev" "$@" | tar -x -C "$dest"
  fi
}

deep_gemm_src() {  # pack the engine's DeepGEMM into $ROOT/deep_gemm/deep_gemm_src-REV.tar.gz
  local out="$ROOT/deep_gemm/deep_gemm_src-${DEEPGEMM_REV:0:12}.tar.gz" tmp whl
  [ -f "$out" ] && return 0
  tmp=$(mktemp -d)
  mkdir -p "$ROOT/deep_gemm" "$tmp/src" "$SGLANG_KERNEL_CACHE"
  whl=$(compgen -G "$SGLANG_KERNEL_CACHE/sglang_kernel-${SGLANG_KERNEL##*==}-*x86_64.whl" | head -n 1 || true)
  if [ -z "$whl" ]; then  # 352 MB, once: offline, put the wheel in $SGLANG_KERNEL_CACHE
    download "$SGLANG_KERNEL_CACHE" "$SGLANG_KERNEL"
    whl=$(compgen -G "$SGLANG_KERNEL_CACHE/sglang_kernel-${SGLANG_KERNEL##*==}-*x86_64.whl" | head -n 1)
  fi
  "$PY" - "$whl" "$tmp/src" <<'PYEOF'
import sys, zipfile
whl, dest = sys.argv[1:]
with zipfile.ZipFile(whl) as z:  # the package as the engine installs it, minus its binary (built for torch 2.9.1)
    z.extractall(dest, [n for n in z.namelist() if n.startswith("deep_gemm/") and not n.endswith(".so")])
PYEOF
  git_export "${DEEPGEMM_GIT_DIR:-}" "$DEEPGEMM_REPO" "$DEEPGEMM_REV" "$tmp/git" csrc deep_gemm
  # The host code must be the wheel's: the same commit's Python package and kernel headers, file for file.
  if ! diff -r -x cute -x cutlass -x __pycache__ "$tmp/git/deep_gemm" "$tmp/src/deep_gemm" >"$tmp/diff"; then
    echo "gpu_bundle.sh: $SGLANG_KERNEL's deep_gemm is not DeepGEMM $DEEPGEMM_REV:" >&2; head -20 "$tmp/diff" >&2
    rm -rf "$tmp"; return 1
  fi
  mv "$tmp/git/csrc" "$tmp/src/csrc"
  git_export "${FMT_GIT_DIR:-}" "$FMT_REPO" "$FMT_REV" "$tmp/fmt" include/fmt
  mkdir -p "$tmp/src/third-party/fmt" && mv "$tmp/fmt/include" "$tmp/src/third-party/fmt/include"
  echo "$DEEPGEMM_REV ${SGLANG_KERNEL}" >"$tmp/src/REVISION"
  tar -C "$tmp/src" -czf "$out" .
  rm -rf "$tmp"
}

download() {  # download DEST PKG...
  local dest=$1; shift
  [ "$#" -gt 0 ] || return 0
  mkdir -p "$dest"
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform any -d "$dest" "$@"
}

slim_ray() {  # rewrite the Ray wheel without the subpackages a local ray.init + actors never import
  local whl
  whl=$(ls "$ROOT"/ray/ray-2.60.0-*.whl)
  "$PY" - "$whl" "${RAY_DROP[@]}" <<'PYEOF'
import sys, zipfile, os
path, drop = sys.argv[1], tuple(d.rstrip("/") + "/" for d in sys.argv[2:])
with zipfile.ZipFile(path) as z:
    if not any(n.startswith(drop) for n in z.namelist()):
        sys.exit(0)  # already slim
    tmp = path + ".tmp"
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as out:
        for info in z.infolist():
            if info.filename.startswith(drop):
                continue
            data = z.read(info)
            if info.filename.endswith(".dist-info/RECORD"):  # keep RECORD true to the files shipped
                data = b"".join(l + b"\n" for l in data.split(b"\n") if l and not l.decode().startswith(drop))
            out.writestr(info, data)
os.replace(tmp, path)
PYEOF
}

groups=("$@")
[ "${#groups[@]}" -gt 0 ] || groups=(core)
total=0
for g in "${groups[@]}"; do
  case "$g" in
    core) download "$ROOT/core" "${CORE[@]}"
          # hydra-core 1.3 needs antlr4-python3-runtime 4.9.*, an sdist only: built here into a pure-Python wheel.
          ls "$ROOT"/core/antlr4_python3_runtime-4.9.3-*.whl >/dev/null 2>&1 ||
            "$PY" -m pip wheel -q --no-deps -w "$ROOT/core" antlr4-python3-runtime==4.9.3 ;;
    ray) download "$ROOT/ray" "${RAY[@]}"; slim_ray ;;
    flashinfer) download "$ROOT/flashinfer" "${FLASHINFER[@]}" ;;
    sglang_ref) download "$ROOT/sglang_ref" "${SGLANG_REF[@]}" ;;
    deep_gemm) deep_gemm_src ;;
    *) echo "gpu_bundle.sh: unknown group '$g' (core, ray, flashinfer, sglang_ref, deep_gemm)" >&2; exit 2 ;;
  esac
  size=$(du -sb "$ROOT/$g" 2>/dev/null | cut -f1 || echo 0)
  total=$((total + size))
  echo "gpu bundle $g: $(ls "$ROOT/$g" 2>/dev/null | wc -l) files, $((size / 1024 / 1024)) MiB in $ROOT/$g"
done
echo "gpu bundle: ${groups[*]} = $((total / 1024 / 1024)) MiB (carry: $(printf "$ROOT/%s " "${groups[@]}"))"
if [ "$total" -gt $((MAX_MIB * 1024 * 1024)) ]; then
  echo "gpu bundle: over ${MAX_MIB} MiB together (a device call carries at most 64 MiB)" >&2
  exit 1
fi
