#!/usr/bin/env bash
# Prints the command that runs Python 3.12 on this machine, for scripts/install.sh: with pyenv holding 3.12.1,
# `env PYENV_VERSION=3.12.1 python3.12` (pyenv's shim finds no python3.12 without it); else `python3.12`.
# pyenv's list is read whole before it is searched: `pyenv versions | grep -q` under pipefail failed at random (grep
# exits at the first match, pyenv then dies of SIGPIPE writing the rest, and the pipeline's status is 141).
set -euo pipefail
versions=$( (command -v pyenv >/dev/null 2>&1 && pyenv versions --bare 2>/dev/null) || true)
if printf '%s\n' "$versions" | grep -x '3.12.1' >/dev/null; then
  echo "env PYENV_VERSION=3.12.1 python3.12"
else
  echo "python3.12"
fi
