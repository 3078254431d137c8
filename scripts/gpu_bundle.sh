#!/usr/bin/env bash
# Download the wheels the lent GPU machine lacks into .gpu_bundle/GROUP/ (git-ignored), for
# `run(carry=[".gpu_bundle/core", ...])`. That machine has no network; it has Python 3.12, torch 2.11 (cu130),
# triton 3.6 and transformers 5.17 (so numpy, safetensors, PyYAML, httpx, requests, tqdm, aiohttp, click, msgpack,
# protobuf, uvloop too). One call carries at most 64 MiB (working tree included), so the wheels come in groups. The
# pins are those of one SGLang release with a TOP contract, --release 0.5.11 (the default, proven on the H200) or
# 0.5.17 (proven on Hopper GPUs, bench/RESULTS.md sessions 15-16), read from that release's wheel (Requires-Dist): one
# table below decides them.
# Sizes: 0.5.11 / 0.5.17.
#   core          the pinned SGLang wheel (installed without its dependencies), the pure-Python packages
#                 `import sglang.srt...` needs (IPython without its optional parts: no import of sglang's needs
#                 them, tests/repo/test_gpu_bundle.py), transformers + tokenizers at the release's pins (5.6.0 / 5.12.1,
#                 tokenizers 0.22.2: the image's transformers 5.17 breaks `import sglang` 0.5.11), Megatron-core,
#                 Hydra/OmegaConf                                                              (~35 / ~50 MiB)
#   ray           Ray 2.60.0 slimmed (no jars, rllib, serve, data, llm, tune, train, dashboard UI) + jsonschema
#                 and friends: the GPU job (`scripts/gpu_run.sh e2e`)                          (~38 / ~38 MiB)
#   flashinfer    flashinfer-python (JIT-compiles on the device; SGLang's sampler imports it) + apache-tvm-ffi +
#                 cuda-tile; 0.5.11: + flashinfer-cubin (its pin) without its cubins, all of them Blackwell's;
#                 0.5.17: + xgrammar 0.2.1 without its static library (`import sglang.srt.server_args`
#                 needs it in 0.5.17, so there also the trainer's import of sglang.srt.batch_invariant_ops: core and
#                 flashinfer together do not fit one carry)                                   (~14 / ~30 MiB)
#   sglang_ref    what SGLang's own Qwen3ForCausalLM imports beyond core (tests/gpu/test_sglang_reference.py)
#   sglang_server what a live `sglang.launch_server` needs beyond core, flashinfer and sglang_ref: sglang-kernel
#                 (0.4.2 / 0.4.5, its Python files and sm90/common_ops only: FA3's flash_ops, sm100 and FlashMLA, and
#                 0.4.5's InfLLM-V2 infllm_ops are left out; `import sgl_kernel` loads only common_ops eagerly), its
#                 HTTP stack (fastapi, uvicorn, ...), torch_memory_saver                      (~24 / ~22 MiB)
#   fa3           sgl_kernel's FA3 build (flash_ops.abi3.so, 1,022 MiB unpacked), the attention kernel of the fa3
#                 backend (the Hopper default, docs/sglang.md): taken out of the same sglang-kernel wheel, its sha256
#                 checked against the wheel's RECORD, xz -9e'd once into $SGLANG_KERNEL_CACHE (5-6 min on 2 cores)
#                 and copied here with its digest (scripts/flash_ops_xz.py); gpu_run.sh unpacks it into the site
#                 dir's sgl_kernel/ and checks the digest again. 0.4.5's packs to 126 MiB, more than a carry:
#                 then it is cut into parts of one carry each, groups fa3, fa3_2, fa3_3, which gpu_run.sh joins
#                 once the last has come                                                       (~51 / 126 MiB)
#   sglang_live   not a folder: builds core, flashinfer, sglang_ref, sglang_server and fa3, the groups a live
#                 server needs, and prints them split into as few carries as hold them (0.5.11: three, also with
#                 ray: fa3 alone fills one). gpu_run.sh installs each carry into the same site dir, which outlives
#                 a call while the machine stays warm: the carries are calls back to back.
#   deep_gemm     (0.5.11 only: 0.5.17's DeepGEMM is another package, sgl-deep-gemm, docs/numerics_0.5.17.md §0.1.3)
#                 the engine's DeepGEMM, to be built on the device against its torch by scripts/build_deep_gemm.py:
#                 the `deep_gemm` package of sglang-kernel (what sglang pins; its kernel headers and the CUTLASS/CuTe
#                 its JIT compiles with) without its binary, the host code (csrc) of sgl-project/DeepGEMM at
#                 $DEEPGEMM_REV (sgl-kernel's pin; its Python package must equal the wheel's, file for file, or
#                 nothing is packed) and fmt's headers, as one tarball. Sources: git clones, or offline
#                 DEEPGEMM_GIT_DIR / FMT_GIT_DIR (git dirs holding those commits)                   (~4 MiB)
# The sglang-kernel wheel (0.4.2: 326 MB, 0.4.5: 383 MB) is downloaded once into $SGLANG_KERNEL_CACHE (offline: put it
# there). .gpu_bundle/RELEASE (and GROUP/RELEASE, which travels with each carry; gpu_run.sh reports it) names the
# release the folders hold: bundling another release into them is refused (remove .gpu_bundle first). A group larger
# than one carry is refused, naming it.
# Usage: bash scripts/gpu_bundle.sh [--release 0.5.11|0.5.17] [GROUP ...]   (default: core). gpu_run.sh installs every
#        carried group.
#        bash scripts/gpu_bundle.sh [--release R] --list GROUP  prints the group's pinned requirements (tests read them).
set -euo pipefail
cd "$(dirname "$0")/.."

PY="${PYTHON:-python3}"
[ -x .venv/bin/python ] && PY="${PYTHON:-.venv/bin/python}"
ROOT=.gpu_bundle
# What one carry may hold: 64 MiB per call, less the working tree that travels with it (tracked and untracked files)
TREE_BYTES=$({ git ls-files -z --cached --others --exclude-standard 2>/dev/null || true; } | xargs -0 -r du -cb 2>/dev/null |
             tail -n 1 | cut -f1)
MAX_BYTES=$(((64 << 20) - ${TREE_BYTES:-$((3 << 20))} - (256 << 10)))

# The SGLang releases with a TOP contract (top_rl/sglang_release/), each with its pins below; --release picks one.
RELEASES=(0.5.11 0.5.17)
RELEASE=0.5.11
LIST=""
ARGS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --release) RELEASE=${2:?--release RELEASE}; shift 2 ;;
    --release=*) RELEASE=${1#*=}; shift ;;
    --list) LIST=${2:?--list GROUP}; shift 2 ;;
    *) ARGS+=("$1"); shift ;;
  esac
done
if [[ " ${RELEASES[*]} " != *" $RELEASE "* ]]; then
  echo "gpu_bundle.sh: SGLang $RELEASE has no TOP contract; the releases with one:" \
       "$(printf '%s, ' "${RELEASES[@]}" | sed 's/, $//')" >&2
  exit 2
fi
R=${RELEASE//./_}

# ---- The pin table: GROUP_ALL is what every release carries, GROUP_<release> what that release adds. The rest of the
# ---- script reads the chosen release's row ($R) and names no release (but the one a folder from before markers holds).
GROUPS_0_5_11=(core ray flashinfer sglang_ref sglang_server fa3 deep_gemm)
GROUPS_0_5_17=(core ray flashinfer sglang_ref sglang_server fa3)  # deep_gemm: 0.5.17's is another package (sgl-deep-gemm
                                                              # 0.1.5.post1, docs/numerics_0.5.17.md §0.1.3): no recipe
CORE_ALL=(
  megatron-core==0.19.2
  # sglang import chain (sglang.utils imports IPython.display; IPython's completer, prompt and traceback extras
  # (jedi, parso, prompt-toolkit, stack-data, pexpect, ...) are never imported on it: IPYTHON_UNUSED below)
  ipython==9.18.1 ipython-pygments-lexers==1.1.1 traitlets==5.16.1 pygments==2.21.0
  pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5
  typing-extensions==4.16.0   # pydantic 2.14 needs >=4.16; the image's may be older
  orjson==3.13.0 pybase64==1.5.1 starlette==1.10.0 anyio==4.16.0
  openai==2.6.1 jiter==0.19.0 distro==1.9.0 sniffio==1.3.1
  pyzmq==27.3.0 partial-json-parser==0.2.1.1.post7 dill==0.4.1 psutil==7.2.2
  # top_rl configs (Qwen3's tokenizer files ship inside top_rl: tasks/data/qwen3_tokenizer/)
  hydra-core==1.3.8 omegaconf==2.3.1
  liger-kernel==0.8.5  # the strong stock trainer's Triton RMSNorm (bench/_stock_gpt.py; pure Python, 0.9 MB)
)
CORE_0_5_11=(
  sglang==0.5.11
  transformers==5.6.0 tokenizers==0.22.2  # sglang 0.5.11's pins; the image's transformers 5.17 breaks `import sglang`
)
CORE_0_5_17=(
  sglang==0.5.17
  transformers==5.12.1  # sglang 0.5.17's pin
  tokenizers==0.22.2    # transformers 5.12.1 takes >=0.22.0,<=0.23.0: the image's 0.23.x is above (no 0.23.0 exists)
)
IPYTHON_UNUSED=(jedi parso prompt_toolkit wcwidth pexpect ptyprocess stack_data executing asttokens pure_eval
                matplotlib_inline)  # import names; tests/repo/test_gpu_bundle.py imports the server with them blocked
RAY_ALL=(ray==2.60.0 jsonschema==4.25.1 referencing==0.36.2 jsonschema-specifications==2025.9.1 rpds-py==0.27.1)
RAY_0_5_11=()
RAY_0_5_17=()  # its ray extra takes ray>=2.55.1
FLASHINFER_ALL=(cuda-tile==1.7.0)
FLASHINFER_0_5_11=(
  flashinfer-python==0.6.8.post1 apache-tvm-ffi==0.1.15.post2  # sglang 0.5.11's flashinfer
  flashinfer-cubin==0.6.8.post1  # sglang 0.5.11's pin beside flashinfer-python (top-rl doctor checks it; flashinfer
                                 # refuses to import beside a cubin of another version). 281 MiB, every cubin sm100 or
                                 # sm103 (trtllm-gen FMHA and GEMMs, read from their ELF headers): carried without them
                                 # (SLIM_0_5_11), its package, headers and checksums (1.2 MiB). A Hopper run loads none;
                                 # on Blackwell flashinfer would fetch a missing one, and the device has no network
)
FLASHINFER_0_5_17=(
  flashinfer-python==0.6.15.post1  # sglang 0.5.17's (flashinfer_python[cu13]: the extra adds only nvidia-cutlass-dsl[cu13]).
                                   # Its own cutlass-dsl, cudnn-frontend, nccl4py and cuda-python are left out as 0.6.8's
                                   # were: `import flashinfer` and its sampler import none of them (imported on CPU from
                                   # the bundle's wheels with the image's packages, nvidia-ml-py among them)
  apache-tvm-ffi==0.1.11           # sglang 0.5.17's pin (flashinfer takes >=0.1.6,<0.2, xgrammar >=0.1.9)
  xgrammar==0.2.1                  # sglang 0.5.17's pin, imported by sglang.srt.server_args: here, beside the tvm-ffi it
                                   # loads, as core holds ~50 MiB already (slimmed: SLIM_0_5_17)
)
# SGLang's Qwen3 (+einops: insurance)
SGLANG_REF_ALL=(compressed-tensors==0.20.1 loguru==0.7.3 msgspec==0.22.0 gguf==0.19.0 einops==0.8.2)
SGLANG_REF_0_5_11=()
SGLANG_REF_0_5_17=()
# A live server's HTTP stack and what its modules import beyond the other groups (found by importing
# sglang.launch_server, http_server, scheduler, model_runner, ... with the image's packages: tests/repo/test_gpu_bundle.py)
SGLANG_SERVER_ALL=(fastapi==0.163.2 annotated-doc==0.0.7 uvicorn==0.54.0 python-multipart==0.0.34
                   opentelemetry-api==1.45.2 importlib-metadata==10.2.0  # fastapi 0.163's telemetry module imports it
                   openai-harmony==0.0.4  # the server's lifespan imports its OpenAI responses endpoint
                   setproctitle==1.3.8 soundfile==0.13.1 cffi==2.1.1 pycparser==3.12
                   torch-memory-saver==0.0.10  # --enable-memory-saver (cluster.gpu_handoff): cu13 hooks in the wheel
                   jsonschema==4.25.1 referencing==0.36.2 jsonschema-specifications==2025.9.1 rpds-py==0.27.1)
SGLANG_SERVER_0_5_11=()
SGLANG_SERVER_0_5_17=()
# sglang-kernel, slimmed to what a dense bf16 model on Hopper loads: its Python files and sm90/common_ops (FA3's
# flash_ops alone is 1 GB unpacked; `import sgl_kernel` loads only common_ops eagerly). 0.5.11's also carries the engine's
# deep_gemm (the deep_gemm group); 0.4.5's infllm_ops is loaded only when InfLLM-V2 attention is called.
SGLANG_KERNEL_0_5_11=sglang-kernel==0.4.2  # sglang 0.5.11's Requires-Dist: common_ops and the engine's deep_gemm
SGLANG_KERNEL_0_5_17=sglang-kernel==0.4.5  # sglang 0.5.17's Requires-Dist
SGLANG_KERNEL_KEEP=(sgl_kernel/)
SGLANG_KERNEL_DROP_ALL=(sgl_kernel/flash_ops sgl_kernel/sm100/ sgl_kernel/flashmla_ops)
SGLANG_KERNEL_DROP_0_5_11=()
SGLANG_KERNEL_DROP_0_5_17=(sgl_kernel/infllm_ops)
# Wheels rewritten without what no job loads (scripts/slim_wheel.py): "GROUP WHEEL_NAME_PREFIX FLAGS" (--drop PREFIX...,
# --keep-cubin-archs SM...)
SLIM_ALL=("ray ray-2.60.0- --drop ray/jars/ ray/rllib/ ray/serve/ ray/data/ ray/llm/ ray/tune/ ray/train/
           ray/dashboard/client/build/")
SLIM_0_5_11=("flashinfer flashinfer_cubin-0.6.8.post1- --keep-cubin-archs sm90")  # the proven arch's cubins: none
SLIM_0_5_17=("flashinfer xgrammar-0.2.1- --drop xgrammar/lib/")  # its static library (65 MB): for linking C++ against it

row() {  # row VAR TABLE: VAR=(TABLE_<release>... TABLE_ALL...), the chosen release's row of one table
  local -n _out=$1 _all="${2}_ALL" _rel="${2}_$R"
  _out=("${_rel[@]}" "${_all[@]}")
}
declare -n GROUPS_R="GROUPS_$R"
row CORE CORE; row RAY RAY; row FLASHINFER FLASHINFER; row SGLANG_REF SGLANG_REF; row SGLANG_SERVER SGLANG_SERVER
row SGLANG_KERNEL_DROP SGLANG_KERNEL_DROP; row SLIM SLIM
SGLANG_KERNEL_R="SGLANG_KERNEL_$R"
SGLANG_KERNEL=${SGLANG_KERNEL:-${!SGLANG_KERNEL_R}}
SGLANG_KERNEL_CACHE=${SGLANG_KERNEL_CACHE:-$HOME/.cache/top_rl/wheels}
# the deep_gemm group (0.5.11's: the engine's DeepGEMM is sglang-kernel 0.4.2's package)
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

sglang_kernel_wheel() {  # the cached sglang-kernel wheel (0.4.2: 326 MB, 0.4.5: 383 MB: downloaded once; offline: cache it)
  local whl
  mkdir -p "$SGLANG_KERNEL_CACHE"
  whl=$(compgen -G "$SGLANG_KERNEL_CACHE/sglang_kernel-${SGLANG_KERNEL##*==}-*x86_64.whl" | head -n 1 || true)
  if [ -z "$whl" ]; then
    download "$SGLANG_KERNEL_CACHE" "$SGLANG_KERNEL" >&2
    whl=$(compgen -G "$SGLANG_KERNEL_CACHE/sglang_kernel-${SGLANG_KERNEL##*==}-*x86_64.whl" | head -n 1)
  fi
  echo "$whl"
}

deep_gemm_src() {  # pack the engine's DeepGEMM into $ROOT/deep_gemm/deep_gemm_src-REV.tar.gz
  local out="$ROOT/deep_gemm/deep_gemm_src-${DEEPGEMM_REV:0:12}.tar.gz" tmp whl
  [ -f "$out" ] && return 0
  tmp=$(mktemp -d)
  mkdir -p "$ROOT/deep_gemm" "$tmp/src"
  whl=$(sglang_kernel_wheel)
  "$PY" - "$whl" "$tmp/src" <<'PYEOF'
import sys, zipfile
whl, dest = sys.argv[1:]
with zipfile.ZipFile(whl) as z:  # the package as the engine installs it, minus its binary (0.4.1's was built for torch 2.9.1; the build here is the checked one)
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
    --platform manylinux_2_34_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 \
    --platform any -d "$dest" "$@"
}

slim() {  # slim GROUP: rewrite the group's wheels the release's SLIM rows name, in place
  local entry g prefix whl
  for entry in "${SLIM[@]}"; do
    read -r g prefix _ <<<"$entry"
    [ "$g" = "$1" ] || continue
    whl=$(compgen -G "$ROOT/$g/$prefix*.whl" | head -n 1) || { echo "gpu_bundle.sh: no $prefix*.whl in $ROOT/$g" >&2; exit 1; }
    # shellcheck disable=SC2086  # the row's flags, split as written
    "$PY" scripts/slim_wheel.py "$whl" "$ROOT/$g" ${entry#"$g $prefix "}
  done
}

fa3() {  # sgl_kernel's FA3 build, xz-packed once per sglang-kernel wheel beside the wheel cache (digest: the RECORD's)
  local whl cached size part n i dir
  compgen -G "$ROOT/fa3/flash_ops.so.xz*" >/dev/null && [ -f "$ROOT/fa3/flash_ops.so.xz.sha256" ] && return 0
  whl=$(sglang_kernel_wheel)
  cached="$SGLANG_KERNEL_CACHE/$(basename "$whl" .whl).flash_ops.so.xz"
  [ -f "$cached" ] && [ -f "$cached.sha256" ] || "$PY" scripts/flash_ops_xz.py pack "$whl" "$cached"
  mkdir -p "$ROOT/fa3"
  size=$(stat -c %s "$cached")
  part=$((MAX_BYTES - (1 << 20)))  # a part and its group's small files fit one carry
  if [ "$size" -le "$part" ]; then
    cp "$cached" "$ROOT/fa3/flash_ops.so.xz"
    cp "$cached.sha256" "$ROOT/fa3/flash_ops.so.xz.sha256"
    return 0
  fi
  # More than a carry (0.5.17's sglang-kernel 0.4.5: 126 MiB): parts of one carry each, in groups fa3, fa3_2, ...,
  # every one with the digest; gpu_run.sh gathers the parts across calls and joins them once the last has come.
  n=$(( (size + part - 1) / part ))
  for ((i = 0; i < n; i++)); do
    dir=fa3; [ "$i" -gt 0 ] && dir="fa3_$((i + 1))"
    mkdir -p "$ROOT/$dir"
    dd if="$cached" of="$ROOT/$dir/flash_ops.so.xz.part$((i + 1))-of-$n" bs=1M iflag=skip_bytes,count_bytes \
      skip=$((i * part)) count="$part" status=none
    cp "$cached.sha256" "$ROOT/$dir/flash_ops.so.xz.sha256"
  done
}

sglang_server() {  # the live server's extra wheels and the slimmed sglang-kernel
  download "$ROOT/sglang_server" "${SGLANG_SERVER[@]}"
  compgen -G "$ROOT/sglang_server/sglang_kernel-*.whl" >/dev/null ||
    "$PY" scripts/slim_wheel.py "$(sglang_kernel_wheel)" "$ROOT/sglang_server" --keep-only "${SGLANG_KERNEL_KEEP[@]}" \
      --drop "${SGLANG_KERNEL_DROP[@]}"
}

group_pins() {  # the pinned requirements of a group under the chosen release (--list)
  case "$1" in
    ipython_unused) printf '%s\n' "${IPYTHON_UNUSED[@]}"; return 0 ;;
  esac
  [[ " ${GROUPS_R[*]} " == *" $1 "* ]] || return 2
  case "$1" in
    core) printf '%s\n' "${CORE[@]}" ;;
    ray) printf '%s\n' "${RAY[@]}" ;;
    flashinfer) printf '%s\n' "${FLASHINFER[@]}" ;;
    sglang_ref) printf '%s\n' "${SGLANG_REF[@]}" ;;
    sglang_server) printf '%s\n' "${SGLANG_SERVER[@]}" "$SGLANG_KERNEL" ;;
    deep_gemm|fa3) echo "$SGLANG_KERNEL" ;;
    *) return 2 ;;
  esac
}

if [ -n "$LIST" ]; then
  group_pins "$LIST" || { echo "gpu_bundle.sh: no pins for group '$LIST' under SGLang $RELEASE" >&2; exit 2; }
  exit 0
fi

groups=()
for g in "${ARGS[@]:-core}"; do  # sglang_live: every group a live server needs
  if [ "$g" = sglang_live ]; then groups+=(core flashinfer sglang_ref sglang_server fa3); else groups+=("$g"); fi
done
for g in "${groups[@]}"; do
  if [[ " ${GROUPS_R[*]} " != *" $g "* ]]; then
    echo "gpu_bundle.sh: unknown group '$g' under SGLang $RELEASE (${GROUPS_R[*]}, sglang_live)" >&2
    exit 2
  fi
done

# The release the folders hold: $ROOT/RELEASE, and a copy in every group folder (so that each carry holds it and
# gpu_run.sh can name it). A folder bundled before the marker existed holds 0.5.11's. Groups of two releases never
# share $ROOT: bundling another release into it is refused before anything is downloaded.
held=()
[ -f "$ROOT/RELEASE" ] && held+=("$(cat "$ROOT/RELEASE")")
for d in "$ROOT"/*/; do
  [ -d "$d" ] || continue
  if [ -f "$d/RELEASE" ]; then held+=("$(cat "$d/RELEASE")"); else held+=(0.5.11); fi
done
for h in "${held[@]}"; do
  if [ "$h" != "$RELEASE" ]; then
    echo "gpu_bundle.sh: $ROOT holds SGLang $h's groups ($(cd "$ROOT" && ls -d -- */ 2>/dev/null | tr -d / | xargs)), not" \
         "$RELEASE's: move it away or remove it (rm -rf $ROOT) to bundle $RELEASE, or bundle --release $h" >&2
    exit 2
  fi
done
mkdir -p "$ROOT"
echo "$RELEASE" >"$ROOT/RELEASE"

declare -A seen sizes
total=0
for g in "${groups[@]}"; do
  [ -n "${seen[$g]:-}" ] && continue
  seen[$g]=1
  case "$g" in
    core) download "$ROOT/core" "${CORE[@]}"
          # hydra-core 1.3 needs antlr4-python3-runtime 4.9.*, an sdist only: built here into a pure-Python wheel.
          ls "$ROOT"/core/antlr4_python3_runtime-4.9.3-*.whl >/dev/null 2>&1 ||
            "$PY" -m pip wheel -q --no-deps -w "$ROOT/core" antlr4-python3-runtime==4.9.3 ;;
    ray) download "$ROOT/ray" "${RAY[@]}" ;;
    flashinfer) download "$ROOT/flashinfer" "${FLASHINFER[@]}" ;;
    sglang_ref) download "$ROOT/sglang_ref" "${SGLANG_REF[@]}" ;;
    sglang_server) sglang_server ;;
    deep_gemm) deep_gemm_src ;;
    fa3) fa3 ;;
  esac
  slim "$g"
  made=("$g")  # the folders the group filled: fa3's parts fill fa3_2, fa3_3, ... too (one carry each)
  if [ "$g" = fa3 ]; then
    for d in "$ROOT"/fa3_*/; do
      if [ -d "$d" ]; then made+=("$(basename "$d")"); fi
    done
  fi
  for m in "${made[@]}"; do
    seen[$m]=1
    echo "$RELEASE" >"$ROOT/$m/RELEASE"
    size=$(du -sb "$ROOT/$m" 2>/dev/null | cut -f1 || echo 0)
    sizes[$m]=$size
    total=$((total + size))
    echo "gpu bundle $m: $(ls "$ROOT/$m" | grep -cvx -e RELEASE -e '.*\.sha256') files, $((size / 1024 / 1024)) MiB in $ROOT/$m (SGLang $RELEASE)"
  done
done
names=("${!seen[@]}")
for g in "${names[@]}"; do  # a carry is one call: a group is never split across two
  if [ "${sizes[$g]}" -gt "$MAX_BYTES" ]; then
    echo "gpu_bundle.sh: group $g is $((sizes[$g] / 1024 / 1024)) MiB, more than one carry holds" \
         "($((MAX_BYTES / 1024 / 1024)) MiB beside the tree): its pins for SGLang $RELEASE must move to another group" >&2
    exit 1
  fi
done
echo "gpu bundle: ${names[*]} = $((total / 1024 / 1024)) MiB (a carry holds $((MAX_BYTES / 1024 / 1024)) MiB beside the tree)"
if [ "$total" -le "$MAX_BYTES" ]; then
  echo "gpu bundle: one carry: $(printf "$ROOT/%s " "${names[@]}")"
  exit 0
fi
# Over one call's limit: first-fit of the groups, largest first, into carries of MAX_BYTES (each carry is one call;
# gpu_run.sh installs each into the same site dir, which outlives the call while the machine stays warm).
carries=()
loads=()
for g in $(for k in "${names[@]}"; do echo "${sizes[$k]} $k"; done | sort -rn | cut -d' ' -f2); do
  placed=""
  for i in "${!carries[@]}"; do
    if [ $((loads[i] + sizes[$g])) -le "$MAX_BYTES" ]; then
      carries[i]="${carries[i]} $ROOT/$g"; loads[i]=$((loads[i] + sizes[$g])); placed=1; break
    fi
  done
  [ -n "$placed" ] || { carries+=("$ROOT/$g"); loads+=("${sizes[$g]}"); }
done
for i in "${!carries[@]}"; do
  echo "gpu bundle: carry $((i + 1)) of ${#carries[@]} ($((loads[i] / 1024 / 1024)) MiB):${carries[i]# }" | sed 's/:\./: ./'
done
if [ "${#carries[@]}" -gt 2 ]; then
  echo "gpu bundle: ${#carries[@]} carries: ${#carries[@]} calls back to back while the machine stays warm (gpu_run.sh" \
       "adds each to the site dir the earlier ones filled)"
fi
