#!/usr/bin/env bash
# Install an SGLang release with a TOP contract (without its GPU dependencies) plus the light packages it needs to be
# imported on CPU. What this enables: SGLang's argparse parser, its HTTP app and its torch-native ops in tests (see
# tests/sglang_cpu.py).
#
#   scripts/install_sglang_cpu.sh                                  0.5.11 (requirements/sglang-cpu.txt) into the venv
#   scripts/install_sglang_cpu.sh --release 0.5.17 --target DIR    0.5.17 (requirements/sglang-cpu-0.5.17.txt) into DIR,
#                                                                  for PYTHONPATH=DIR in front of a venv holding 0.5.11
#   scripts/install_sglang_cpu.sh --release 0.5.17                 0.5.17 into the venv, replacing 0.5.11
# The venv is the active one, or the one given as PYTHON=/path/to/venv/bin/python.
set -euo pipefail
cd "$(dirname "$0")/.."

RELEASE=0.5.11
TARGET=""
while [ $# -gt 0 ]; do
  case "$1" in
    --release) RELEASE="$2"; shift 2 ;;
    --target) TARGET="$2"; shift 2 ;;
    *) echo "install_sglang_cpu.sh: unknown argument $1 (use --release R, --target DIR)" >&2; exit 2 ;;
  esac
done
case "$RELEASE" in
  0.5.11) REQ=requirements/sglang-cpu.txt ;;
  0.5.17) REQ=requirements/sglang-cpu-0.5.17.txt ;;
  *) echo "install_sglang_cpu.sh: SGLang $RELEASE has no TOP contract; the releases with one: 0.5.11, 0.5.17" >&2
     exit 2 ;;
esac

PY="${PYTHON:-python}"
"$PY" - <<'PYEOF'
import sys
if sys.prefix == sys.base_prefix:
    sys.exit("install_sglang_cpu.sh: not in a virtual environment (activate .venv or set PYTHON=.venv/bin/python)")
if sys.version_info[:2] != (3, 12):
    sys.exit(f"install_sglang_cpu.sh: Python 3.12 required, this is {sys.version.split()[0]}")
PYEOF

SGLANG_PIN=$(grep -E '^sglang==' "$REQ" | sed 's/[[:space:]]*#.*//')
OTHERS=$(mktemp)
trap 'rm -f "$OTHERS"' EXIT
grep -vE '^(sglang==|#|[[:space:]]*$)' "$REQ" | sed 's/[[:space:]]*#.*//' > "$OTHERS"

if [ "$RELEASE" = 0.5.11 ]; then
  [ -z "$TARGET" ] || { echo "install_sglang_cpu.sh: --target is for a release beside the venv's 0.5.11" >&2; exit 2; }
  "$PY" -m pip install --no-deps "$SGLANG_PIN"
  "$PY" -m pip install -c "$REQ" -r "$OTHERS"
elif [ -n "$TARGET" ]; then
  # a clean dir: pip --target does not replace an older copy file by file
  rm -rf "$TARGET"
  "$PY" -m pip install -q --no-deps --target "$TARGET" "$SGLANG_PIN" -r "$OTHERS"
else
  "$PY" -m pip install --no-deps "$SGLANG_PIN" -r "$OTHERS"
fi

PP="${TARGET:+$(cd "$TARGET" && pwd)${PYTHONPATH:+:$PYTHONPATH}}"
PYTHONPATH="${PP:-${PYTHONPATH:-}}" SGLANG_USE_CPU_ENGINE=1 "$PY" -W ignore -c "
import sglang, sglang.srt.server_args, sglang.srt.layers.rotary_embedding, sglang.srt.layers.layernorm, sglang.srt.layers.activation
assert sglang.__version__ == '$RELEASE', sglang.__version__
print('sglang', sglang.__version__, 'imports on CPU' + (' from $TARGET' if '$TARGET' else ''))
"
