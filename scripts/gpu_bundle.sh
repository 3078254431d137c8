#!/usr/bin/env bash
# Download the wheels the lent GPU machine lacks into .gpu_bundle/ (git-ignored), for `run(carry=[".gpu_bundle"])`.
# That machine has no network; it has Python 3.12, torch 2.11 (cu130), triton 3.6 and transformers (so
# numpy, safetensors, tokenizers, PyYAML, httpx, requests, tqdm too). This bundle adds the pinned SGLang
# wheel (installed there without its dependencies: sglang-kernel and its torch pin cannot be carried), the
# pure-Python packages needed to import sglang.srt.batch_invariant_ops and
# sglang.srt.layers.attention.triton_ops.*, Megatron-core, and Hydra/OmegaConf for top_rl's configs.
# On the device:  pip install --no-deps --no-index .gpu_bundle/*.whl && pip install --no-deps --no-build-isolation -e .
set -euo pipefail
cd "$(dirname "$0")/.."

PY="${PYTHON:-python3}"
[ -x .venv/bin/python ] && PY="${PYTHON:-.venv/bin/python}"
DEST=.gpu_bundle
MAX_MIB=40

PKGS=(
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
# hydra-core 1.3 needs antlr4-python3-runtime 4.9.*, published as an sdist only: built here into a
# pure-Python wheel (py3-none-any), so the device installs it offline.
ANTLR=antlr4-python3-runtime==4.9.3

mkdir -p "$DEST"
"$PY" -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform any -d "$DEST" "${PKGS[@]}"

if ! ls "$DEST"/antlr4_python3_runtime-4.9.3-*.whl >/dev/null 2>&1; then
  "$PY" -m pip wheel --no-deps -w "$DEST" "$ANTLR"
fi

total=$(du -sb "$DEST" | cut -f1)
echo "gpu bundle: $(ls "$DEST" | wc -l) files, $((total / 1024 / 1024)) MiB ($total bytes) in $DEST"
if [ "$total" -gt $((MAX_MIB * 1024 * 1024)) ]; then
  echo "gpu bundle: over ${MAX_MIB} MiB (a device call carries at most 64 MiB)" >&2
  exit 1
fi
