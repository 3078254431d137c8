#!/usr/bin/env bash
# Set up .venv (Python 3.12) with this package, its pinned stack and the CPU-importable SGLang wheel.
# Idempotent: a second run only checks. Used by the README's two commands and by .ci/run.
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1

# Inductor's CPU backend (rl-mode RoPE is torch.compile'd in tests/kernels/test_sglang_native_ops.py) needs g++.
if ! command -v g++ >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq g++ >/dev/null
  else echo "install.sh: g++ is missing (sudo apt-get install g++)" >&2; exit 1; fi
fi

if [ ! -x .venv/bin/python ]; then
  read -r -a PY312 <<<"$(bash scripts/find_python.sh)"  # pyenv's 3.12.1 where it has one
  "${PY312[@]}" -m venv .venv
fi
PY=.venv/bin/python
"$PY" -c 'import sys; assert sys.version_info[:2] == (3, 12), "TOP-RL needs Python 3.12, got " + sys.version'

# torch pinned to the release torchvision (and so the sglang import) needs: requirements/sglang-cpu.txt.
"$PY" -m pip install -q -c requirements/sglang-cpu.txt -e '.[test]'
PYTHON="$PY" bash scripts/install_sglang_cpu.sh >/dev/null
echo "install.sh: .venv ready ($("$PY" -c 'import torch, megatron.core, ray; print("torch", torch.__version__, "| megatron-core", megatron.core.__version__, "| ray", ray.__version__)'))"
