"""scripts/install.sh finds Python 3.12 through scripts/find_python.sh. Under pyenv the README's first command failed
at random (`pyenv: python3.12: command not found`, one in three): `pyenv versions --bare | grep -qx 3.12.1` under
pipefail returns 141 when grep closes the pipe before pyenv has written its list. The check now reads the list whole."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "find_python.sh"
# What install.sh ran before: the same question, piped into grep -q under pipefail
OLD = ("set -euo pipefail; if command -v pyenv >/dev/null 2>&1 && pyenv versions --bare | grep -qx '3.12.1'; "
       "then echo 'env PYENV_VERSION=3.12.1 python3.12'; else echo python3.12; fi")


def _slow_pyenv(tmp_path: Path) -> dict:
    """A pyenv whose list starts with 3.12.1 and goes on past a pipe's buffer, as a long real list does."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "pyenv").write_text('#!/bin/sh\n[ "$1 $2" = "versions --bare" ] || exit 1\necho 3.12.1\n'
                                   'i=0; while [ $i -lt 20000 ]; do echo 3.11.$i; i=$((i+1)); done\n')
    (bin_dir / "pyenv").chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}


def _ask(cmd: list[str], env: dict) -> str:
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=60).stdout.strip()


def test_a_pyenv_list_longer_than_the_pipe_is_read_whole(tmp_path):
    env = _slow_pyenv(tmp_path)
    assert _ask(["bash", "-c", OLD], env) == "python3.12"  # the old check: SIGPIPE, 141, the wrong interpreter
    assert _ask(["bash", str(SCRIPT)], env) == "env PYENV_VERSION=3.12.1 python3.12"


def test_no_pyenv_means_the_plain_python(tmp_path):
    env = {**os.environ, "PATH": "/usr/bin:/bin"}
    assert _ask(["bash", str(SCRIPT)], env) == "python3.12"


@pytest.mark.skipif(shutil.which("pyenv") is None or "3.12.1" not in subprocess.run(
    ["pyenv", "versions", "--bare"], capture_output=True, text=True).stdout, reason="needs pyenv holding 3.12.1")
def test_fifty_runs_under_the_real_pyenv_all_find_3_12_1():
    answers = {_ask(["bash", str(SCRIPT)], dict(os.environ)) for _ in range(50)}
    assert answers == {"env PYENV_VERSION=3.12.1 python3.12"}
    version = subprocess.run(["env", "PYENV_VERSION=3.12.1", "python3.12", "--version"], capture_output=True,
                             text=True, timeout=60).stdout
    assert version.startswith("Python 3.12.1")
