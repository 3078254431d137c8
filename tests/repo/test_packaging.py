"""Issue 14: a non-editable install (`pip install .`, the built wheel) starts `top-rl` with the shipped
configs. The wheel is built from a copy of the sources (no build isolation: setuptools is in the venv,
so no download), its file list must hold every yaml of the Hydra tree, and the unpacked wheel (what
`pip install` puts in site-packages) composes the config and plans a run with no checkout on the path."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from top_rl.cli import CONF_DIR

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "top_rl", src / "top_rl", ignore=shutil.ignore_patterns("__pycache__"))
    out = tmp_path_factory.mktemp("wheel")
    res = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                          "-w", str(out), str(src)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    (whl,) = out.glob("top_rl-*.whl")
    return whl


def test_wheel_ships_every_shipped_config(wheel):
    shipped = sorted(str(p.relative_to(Path(CONF_DIR).parent.parent)) for p in Path(CONF_DIR).rglob("*.yaml"))
    assert "top_rl/conf/config.yaml" in shipped and "top_rl/conf/experiment/gsm8k_qwen3_0.6b.yaml" in shipped
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = [p for p in shipped if p not in names]
    assert not missing, f"the wheel lacks {missing}"
    # Qwen3's tokenizer (task.tokenizer=qwen3) with its license: no dependency supplies it any more
    tok = {f"top_rl/tasks/data/qwen3_tokenizer/{n}" for n in ("tokenizer.json.gz", "tokenizer_config.json", "LICENSE")}
    assert tok <= names, f"the wheel lacks {sorted(tok - names)}"


def test_unpacked_wheel_composes_and_plans_without_the_checkout(wheel, tmp_path):
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PYTHONPATH=str(site), WANDB_MODE="disabled")
    # -P: no cwd/script dir on sys.path; cwd elsewhere: the checkout cannot be what is imported.
    probe = ("import json, top_rl.cli as c; cfg = c.compose(['+experiment=gsm8k_qwen3_0.6b']); "
             "print(json.dumps({'file': c.__file__, 'conf': c.CONF_DIR, 'task': cfg.task.name}))")
    res = subprocess.run([sys.executable, "-P", "-c", probe], capture_output=True, text=True, cwd=tmp_path,
                         env=env, timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    got = json.loads(res.stdout.strip().splitlines()[-1])
    assert got["file"].startswith(str(site)) and got["conf"] == str(site / "top_rl" / "conf")
    assert got["task"] == "gsm8k"
    # the console script's path: @hydra.main with the package-relative config dir
    res = subprocess.run([sys.executable, "-P", "-m", "top_rl.cli", "dry_run=true", f"run_dir={tmp_path / 'r'}"],
                         capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    assert json.loads(res.stdout)["engines"][0]["kind"] == "native"


def test_wheel_ships_the_report_command(wheel):
    """top-rl-report (issue 52): its module in the wheel and its console script in the wheel's entry points."""
    zf = zipfile.ZipFile(wheel)
    assert "top_rl/tools/report.py" in zf.namelist()
    (ep,) = [n for n in zf.namelist() if n.endswith(".dist-info/entry_points.txt")]
    assert "top-rl-report = top_rl.cli:report_main" in zf.read(ep).decode()
