#!/usr/bin/env bash
# Install the pinned SGLang wheel (without its GPU dependencies) plus the light packages it needs to be
# imported on CPU, into the active virtual environment (or the one given as PYTHON=/path/to/venv/bin/python).
# What this enables: SGLang's argparse parser and its torch-native ops in tests (see tests/sglang_cpu.py).
set -euo pipefail
cd "$(dirname "$0")/.."

PY="${PYTHON:-python}"
"$PY" - <<'PYEOF'
import sys
if sys.prefix == sys.base_prefix:
    sys.exit("install_sglang_cpu.sh: not in a virtual environment (activate .venv or set PYTHON=.venv/bin/python)")
if sys.version_info[:2] != (3, 12):
    sys.exit(f"install_sglang_cpu.sh: Python 3.12 required, this is {sys.version.split()[0]}")
PYEOF

REQ=requirements/sglang-cpu.txt
SGLANG_PIN=$(grep -E '^sglang==' "$REQ" | sed 's/[[:space:]]*#.*//')
OTHERS=$(mktemp)
trap 'rm -f "$OTHERS"' EXIT
grep -vE '^(sglang==|#|[[:space:]]*$)' "$REQ" | sed 's/[[:space:]]*#.*//' > "$OTHERS"

"$PY" -m pip install --no-deps "$SGLANG_PIN"
"$PY" -m pip install -c "$REQ" -r "$OTHERS"

SGLANG_USE_CPU_ENGINE=1 "$PY" -W ignore -c "
import sglang, sglang.srt.server_args, sglang.srt.layers.rotary_embedding, sglang.srt.layers.layernorm, sglang.srt.layers.activation
print('sglang', sglang.__version__, 'imports on CPU')
"
