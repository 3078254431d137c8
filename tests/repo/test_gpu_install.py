"""The GPU install (issue 53 item 1): one pyproject extra per SGLang release with a TOP contract (`sglang0511`,
`sglang0517`) installs that release with its wheel's own pins. Three records must agree: the extra, the release
adapter's `gpu_pins` (what `top-rl doctor` checks) and the wheel's METADATA (requirements/sglang-<v>-requires-dist.txt);
and the README's GPU command must resolve on PyPI from a fresh Python 3.12 venv to exactly those pins (pip
--dry-run: metadata only, nothing installed). Also: every third-party module top_rl imports is declared, and every
core dependency is used."""

from __future__ import annotations

import ast
import json
import re
import socket
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from top_rl import sglang_release
from top_rl.tools.doctor import extra_for

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PROJECT = PYPROJECT["project"]


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name.lower())


def pins(reqs: list[str]) -> dict[str, str]:
    """name -> version of each `name==version` requirement (markers that do not hold on Linux x86_64 py3.12 dropped)."""
    env = {"sys_platform": "linux", "platform_machine": "x86_64", "python_version": "3.12", "extra": ""}
    out = {}
    for r in map(Requirement, reqs):
        spec = [s for s in r.specifier if s.operator == "=="]
        if spec and (not r.marker or r.marker.evaluate(env)):
            out[norm(r.name)] = spec[0].version
    return out


def wheel_requires(version: str) -> list[str]:
    path = ROOT / f"requirements/sglang-{version}-requires-dist.txt"
    return [ln.strip() for ln in path.read_text().splitlines() if ln.strip() and not ln.startswith("#")]


@pytest.mark.parametrize("version", sorted(sglang_release.RELEASES))
def test_extra_adapter_and_wheel_agree(version):
    release = sglang_release.RELEASES[version]
    extra = pins(PROJECT["optional-dependencies"][extra_for(version)])
    adapter = {norm(n): v for n, v in release.gpu_pins}
    wheel = pins(wheel_requires(version))
    assert extra.pop("sglang") == version
    assert {"torch", "sglang-kernel", "flashinfer-python", "transformers"} <= set(adapter)
    assert {k: extra.get(k) for k in adapter} == adapter, "pyproject's extra and the adapter's gpu_pins differ"
    assert {k: wheel.get(k) for k in adapter} == adapter, "the adapter's gpu_pins differ from the wheel's Requires-Dist"
    # nothing in the extra contradicts the wheel (a pin the wheel also makes must be the wheel's)
    assert {k: v for k, v in extra.items() if k in wheel and wheel[k] != v} == {}


def _top_level_imports() -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for path in (ROOT / "top_rl").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module else [])
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top != "top_rl":
                    found.setdefault(top, set()).add(str(path.relative_to(ROOT)))
    return found


# import name -> distribution, where they differ (or the distribution is not installed in the CPU venv)
MODULE_DIST = {"hydra": "hydra-core", "megatron": "megatron-core", "math_verify": "math-verify",
               "liger_kernel": "liger-kernel", "pynvml": "nvidia-ml-py", "yaml": "pyyaml"}
# imports that are optional (guarded, or only on one path) -> the extras that must declare them
GPU_EXTRAS = tuple(extra_for(v) for v in sglang_release.RELEASES)
OPTIONAL = {"datasets": ("math",), "pyarrow": ("math",), "sglang": GPU_EXTRAS, "liger-kernel": GPU_EXTRAS,
            "nvidia-ml-py": GPU_EXTRAS}
# core dependencies no top_rl module imports by name, each with why it is declared
USED_INDIRECTLY = {"triton": "megatron-core 0.19 imports it at package import (docs/megatron.md)"}


def test_every_import_is_declared_and_every_core_dependency_is_used():
    declared_core = {norm(Requirement(r).name) for r in PROJECT["dependencies"]}
    extras = {e: {norm(Requirement(r).name) for r in reqs} for e, reqs in PROJECT["optional-dependencies"].items()}
    imports = _top_level_imports()
    dists = {norm(MODULE_DIST.get(m, m)): files for m, files in imports.items()}
    undeclared = {d: sorted(f) for d, f in dists.items()
                  if d not in declared_core and not (d in OPTIONAL and all(d in extras[e] for e in OPTIONAL[d]))}
    assert not undeclared, f"imported but not declared in pyproject.toml (core, or its extras): {undeclared}"
    unused = declared_core - set(dists) - set(USED_INDIRECTLY)
    assert not unused, f"core dependencies no top_rl module imports: {sorted(unused)}"


def _pypi_reachable() -> str | None:
    try:
        socket.create_connection(("pypi.org", 443), timeout=5).close()
        return None
    except OSError as e:
        return f"PyPI (pypi.org:443) is unreachable from here ({e}): the GPU install cannot be resolved"


@pytest.fixture(scope="module")
def fresh_venv(tmp_path_factory) -> Path:
    """A Python 3.12 venv with a pip that reads PyPI's metadata files (PEP 658/714), so a dry run downloads no wheel
    (the venv's own pip downloads every candidate wheel: GBs for torch and triton)."""
    why = _pypi_reachable()
    if why:
        pytest.skip(why)
    venv = tmp_path_factory.mktemp("gpu-install") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    res = subprocess.run([str(venv / "bin/python"), "-m", "pip", "install", "-q", "pip>=25"], capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    return venv


@pytest.mark.slow
@pytest.mark.parametrize("version", sorted(sglang_release.RELEASES))
def test_gpu_install_resolves_on_pypi_to_the_release_pins(fresh_venv, version, tmp_path):
    report = tmp_path / "report.json"
    res = subprocess.run([str(fresh_venv / "bin/python"), "-m", "pip", "install", "--dry-run", "--ignore-installed",
                          "--quiet", "--report", str(report), f"{ROOT}[{extra_for(version)}]"],
                         capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-4000:]
    got = {norm(i["metadata"]["name"]): i["metadata"]["version"] for i in json.loads(report.read_text())["install"]}
    want = {"sglang": version, **{norm(n): v for n, v in sglang_release.RELEASES[version].gpu_pins}}
    assert {k: got.get(k) for k in want} == want
    assert got["megatron-core"].startswith("0.19.") and got["top-rl"] == PROJECT["version"]


def test_readme_gives_one_gpu_install_command_for_the_default_release():
    """The README's GPU section is one command, installing the default contract's release through its extra (the one
    the resolution test above resolves) and running the doctor."""
    from top_rl import contract

    readme = (ROOT / "README.md").read_text()
    section = readme.split("### GPU install", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```bash\n(.*?)```", section, re.S)
    assert len(blocks) == 1 and len(blocks[0].strip().splitlines()) == 1, blocks
    cmd = blocks[0].strip()
    assert f"pip install -e '.[{extra_for(contract.DEFAULT.sglang_version)}]'" in cmd and cmd.endswith("top-rl doctor")
