"""The GPU bundle recipe (scripts/gpu_bundle.sh), checked on CPU as far as CPU allows: the groups' pins agree with
what each pinned SGLang wheel itself requires (0.5.11's installed here, 0.5.17's recorded in
requirements/sglang-0.5.17-requires-dist.txt), a bundle of one release is never mixed with another's, the carries,
and SGLang's server modules import without the parts the bundle leaves out (the wheel tools it runs:
tests/repo/test_wheel_tools.py). Nothing here downloads: the script runs on its own table (--list), or with a stand-in python
that does nothing (so that a refusal that failed to happen cannot reach the network either)."""

from __future__ import annotations

import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from tests import sglang_cpu

from top_rl import sglang_release

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts/gpu_bundle.sh"
_ERR = sglang_cpu.import_error()
RELEASES = tuple(sglang_release.RELEASES)  # every release with a TOP contract has a bundle
GROUPS = ("core", "ray", "flashinfer", "sglang_ref", "sglang_server")
LIVE = ("core", "flashinfer", "sglang_ref", "sglang_server", "fa3")  # sglang_live
# What a wheel's marker is evaluated for: the lent machine (Linux x86_64, CPython 3.12)
_TARGET = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux", "platform_system": "Linux",
           "platform_machine": "x86_64", "implementation_name": "cpython", "platform_python_implementation": "CPython",
           "os_name": "posix", "extra": ""}


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name.lower())


def pins(group: str, release: str | None = None) -> dict[str, str]:
    """The group's `name==version` pins under `release` (None: the script's default)."""
    out = subprocess.run(["bash", str(SCRIPT), *(("--release", release) if release else ()), "--list", group],
                         capture_output=True, text=True, check=True).stdout.split()
    return {_norm(p.split("==")[0]): p.split("==")[1] for p in out if "==" in p}


def recorded_requires(release: str) -> list[str] | None:
    path = ROOT / f"requirements/sglang-{release}-requires-dist.txt"
    if not path.exists():
        return None
    return [line.strip() for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")]


def _installed_version() -> str | None:
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return None


def sglang_requires(release: str) -> list[Requirement]:
    """The requirements (no extras) the sglang wheel of `release` declares for the lent machine: its installed metadata
    when that release is the one importable here, else the record of its wheel's METADATA in requirements/."""
    if _installed_version() == release:
        lines = [r for r in importlib.metadata.requires("sglang") or [] if "extra ==" not in r]
    else:
        lines = recorded_requires(release)
        if lines is None:
            pytest.skip(f"sglang {release}'s metadata: neither installed here nor recorded in requirements/")
    return [r for r in map(Requirement, lines) if not r.marker or r.marker.evaluate(_TARGET)]


@pytest.mark.parametrize("release", RELEASES)
def test_bundle_pins_are_what_the_pinned_sglang_requires(release):
    """Every requirement of the release's sglang wheel that a live-server group carries is met by the carried pin
    (sglang-kernel, flashinfer and transformers must be carried, at exactly the wheel's pins)."""
    want = {_norm(r.name): r for r in sglang_requires(release)}
    have = {k: v for g in LIVE for k, v in pins(g, release).items()}
    assert have["sglang"] == release
    for name in ("sglang-kernel", "flashinfer-python", "transformers"):
        spec = str(want[name].specifier)
        assert spec == f"=={have[name]}", f"{name}: bundle {have[name]}, sglang {release} requires {spec}"
    for name, req in want.items():
        if name in have:
            assert req.specifier.contains(Version(have[name]), prereleases=True), \
                f"{name}: bundle {have[name]}, sglang {release} requires {req}"


@pytest.mark.parametrize("release", RELEASES)
def test_every_pin_the_doctor_checks_is_carried_at_its_version(release):
    """`top-rl doctor` checks the release's gpu_pins (its wheel's Requires-Dist: sglang 0.5.11 pins flashinfer-cubin
    beside flashinfer-python); the bundle's live groups must carry each at that version, or the doctor fails on the
    device (bench/RESULTS.md session 19: flashinfer-cubin missing). torch is the image's own (2.11.0)."""
    have = {k: v for g in LIVE for k, v in pins(g, release).items()}
    for dist, want in sglang_release.RELEASES[release].gpu_pins:
        if dist == "torch":
            continue
        assert have.get(_norm(dist)) == want, f"{dist}: SGLang {release} pins {want}, the bundle carries {have.get(_norm(dist))}"
    pinned = dict(sglang_release.RELEASES[release].gpu_pins)
    assert ("flashinfer-cubin" in have) == ("flashinfer-cubin" in pinned)  # carried where pinned (0.5.11), only there
    if "flashinfer-cubin" in pinned:
        assert "flashinfer-cubin" in pins("flashinfer", release)  # beside flashinfer-python, whose import checks it


def test_the_recorded_0_5_17_requirements_are_the_wheels():
    """The record is its wheel's METADATA: where 0.5.17 is importable (PYTHONPATH=.sglang0517) it must equal it, and
    everywhere it must hold the pins requirements/sglang-cpu-0.5.17.txt took from the same wheel."""
    recorded = recorded_requires("0.5.17")
    cpu = [line.split("#")[0].strip() for line in (ROOT / "requirements/sglang-cpu-0.5.17.txt").read_text().splitlines()
           if line.split("#")[0].strip() and not line.startswith("sglang==")]
    assert cpu and set(cpu) <= set(recorded), f"{cpu} not in the record"
    if _installed_version() == "0.5.17":
        assert recorded == [r for r in importlib.metadata.requires("sglang") if "extra ==" not in r]


@pytest.mark.parametrize("release", RELEASES)
def test_groups_share_no_package_at_two_versions(release):
    seen: dict[str, tuple[str, str]] = {}
    for group in GROUPS:
        for name, version in pins(group, release).items():
            if name in seen:
                assert seen[name][1] == version, f"{name}: {seen[name][0]} pins {seen[name][1]}, {group} {version}"
            seen[name] = (group, version)


@pytest.mark.parametrize("release", RELEASES)
def test_list_prints_the_chosen_releases_pins(release):
    """--list answers for the release asked, and only the releases' differences differ."""
    other = next(r for r in RELEASES if r != release)
    assert pins("core", release)["sglang"] == release
    assert pins("ray", release) == pins("ray", other)
    assert pins("sglang_server", release)["sglang-kernel"] != pins("sglang_server", other)["sglang-kernel"]
    assert pins("core") == pins("core", "0.5.11") != pins("core", "0.5.17")  # the default: 0.5.11


def test_deep_gemm_is_0_5_11s_only():
    assert pins("deep_gemm", "0.5.11") == {"sglang-kernel": "0.4.2"}
    out = subprocess.run(["bash", str(SCRIPT), "--release", "0.5.17", "--list", "deep_gemm"], capture_output=True, text=True)
    assert out.returncode == 2 and "no pins for group 'deep_gemm' under SGLang 0.5.17" in out.stderr


def _copy(tmp_path: Path) -> Path:
    """The two scripts in a tree of their own (no git: the carry's tree size falls back to 3 MiB), with a python that
    does nothing: `pip download` "succeeds" without a byte, so only what a test puts in .gpu_bundle is there."""
    (tmp_path / "scripts").mkdir()
    for name in ("gpu_bundle.sh", "slim_wheel.py"):
        shutil.copy(ROOT / "scripts" / name, tmp_path / "scripts" / name)
    stub = tmp_path / "python"
    stub.write_text("#!/bin/sh\nexit 0\n")
    stub.chmod(0o755)
    return tmp_path


def _bundle(tree: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(tree / "scripts/gpu_bundle.sh"), *args], capture_output=True, text=True,
                          env={**os.environ, "PYTHON": str(tree / "python"), "GIT_DIR": str(tree / "no-git")},
                          timeout=60)


def test_a_release_without_a_contract_is_refused_naming_those_with_one(tmp_path):
    tree = _copy(tmp_path)
    for args in (("--release", "0.5.99", "--list", "core"), ("--release", "0.5.99", "sglang_live")):
        out = _bundle(tree, *args)
        assert out.returncode == 2, out.stderr
        assert out.stderr.splitlines()[-1] == \
            f"gpu_bundle.sh: SGLang 0.5.99 has no TOP contract; the releases with one: {', '.join(RELEASES)}"
    assert not (tree / ".gpu_bundle").exists()


def _group(tree: Path, group: str, release: str | None, files: dict[str, int]) -> None:
    d = tree / ".gpu_bundle" / group
    d.mkdir(parents=True)
    if release:
        (d / "RELEASE").write_text(release + "\n")
    for name, size in files.items():
        with open(d / name, "wb") as f:
            f.truncate(size)  # sparse: its size counts (du -sb), nothing is written


@pytest.mark.parametrize("marked", [True, False])
def test_a_bundle_of_one_release_refuses_another(tmp_path, marked):
    """Folders of 0.5.11 (marked, or from before the marker: 0.5.11's) refuse a 0.5.17 bundle before any download,
    naming both releases; the same release goes on and writes the marker into the group it bundled."""
    tree = _copy(tmp_path)
    _group(tree, "sglang_ref", "0.5.11" if marked else None, {"loguru-0.7.3-py3-none-any.whl": 10})
    if marked:
        (tree / ".gpu_bundle/RELEASE").write_text("0.5.11\n")
    out = _bundle(tree, "--release", "0.5.17", "sglang_ref")
    assert out.returncode == 2
    assert "gpu_bundle.sh: .gpu_bundle holds SGLang 0.5.11's groups (sglang_ref), not 0.5.17's" in out.stderr
    assert "rm -rf .gpu_bundle" in out.stderr
    assert (tree / ".gpu_bundle/RELEASE").exists() == marked  # untouched
    out = _bundle(tree, "sglang_ref")
    assert out.returncode == 0, out.stderr
    assert (tree / ".gpu_bundle/RELEASE").read_text() == "0.5.11\n"
    assert (tree / ".gpu_bundle/sglang_ref/RELEASE").read_text() == "0.5.11\n"
    assert "gpu bundle: one carry: .gpu_bundle/sglang_ref" in out.stdout


def test_a_group_larger_than_a_carry_is_refused_naming_it(tmp_path):
    tree = _copy(tmp_path)
    _group(tree, "sglang_ref", None, {"gguf-0.19.0-py3-none-any.whl": 62 << 20})
    out = _bundle(tree, "sglang_ref")
    assert out.returncode == 1
    assert "gpu_bundle.sh: group sglang_ref is 62 MiB, more than one carry holds (60 MiB beside the tree)" in out.stderr


def _fa3_group(tree: Path, release: str, mib: int) -> None:
    _group(tree, "fa3", release, {"flash_ops.so.xz": mib << 20, "flash_ops.so.xz.sha256": 100})


def test_sglang_live_prints_as_many_carries_as_the_groups_need(tmp_path):
    """0.5.17's live server with ray (sizes as built: core 50, ray 38, flashinfer 30, sglang_server 22 MiB, fa3's
    packed FA3 build ~51) takes four carries, each group whole in one; the carries are printed for the calls to make."""
    tree = _copy(tmp_path)
    mib = 1 << 20
    _group(tree, "core", "0.5.17", {"sglang-0.5.17-cp312-cp312-manylinux_2_34_x86_64.whl": 50 * mib,
                                    "antlr4_python3_runtime-4.9.3-py3-none-any.whl": 1})
    _group(tree, "ray", "0.5.17", {"ray-2.60.0-cp312-cp312-manylinux2014_x86_64.whl": 38 * mib})
    _group(tree, "flashinfer", "0.5.17", {"xgrammar-0.2.1-cp312-cp312-manylinux_2_28_x86_64.whl": 30 * mib})
    _group(tree, "sglang_ref", "0.5.17", {"loguru-0.7.3-py3-none-any.whl": mib})
    _group(tree, "sglang_server", "0.5.17", {"sglang_kernel-0.4.5-cp310-abi3-manylinux2014_x86_64.whl": 22 * mib})
    _fa3_group(tree, "0.5.17", 51)
    out = _bundle(tree, "--release", "0.5.17", "sglang_live", "ray")
    assert out.returncode == 0, out.stderr
    carries = [line.split(":", 2)[2].split() for line in out.stdout.splitlines() if line.startswith("gpu bundle: carry")]
    assert len(carries) == 4 and "gpu bundle: carry 4 of 4" in out.stdout
    assert sorted(g for c in carries for g in c) == sorted(f".gpu_bundle/{g}" for g in (*LIVE, "ray"))
    out = _bundle(tree, "--release", "0.5.17", "sglang_live")
    assert "gpu bundle: carry 3 of 3" in out.stdout and "carry 4" not in out.stdout
    assert "gpu bundle fa3: 1 files" in out.stdout  # the digest beside it is not counted as a file to install


from tests.gpu._common import SERVER_DEPENDENCIES, SERVER_MODULES, missing_server_module  # noqa: E402


@pytest.mark.skipif(_ERR is not None, reason=_ERR or "")
def test_the_live_tests_name_the_server_module_a_machine_lacks(tmp_path):
    """Issue 30: on a GPU machine with sglang importable but its server's dependencies absent, tests/gpu/test_sglang_live
    errored 8 times at setup ("server exited with code 1"). It now skips naming the module; this is its check, run on
    real interpreters: this one as installed, and this one with a module it has made absent (a sitecustomize that
    refuses its import, as a missing install would)."""
    import importlib.util

    absent = next(m for m in SERVER_DEPENDENCIES if importlib.util.find_spec(m) is None)  # CPU: no sgl_kernel at least
    assert missing_server_module() == (absent, f"ModuleNotFoundError: No module named '{absent}'")
    (tmp_path / "sitecustomize.py").write_text(
        "import importlib.abc, sys\n"
        "class Absent(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path, target=None):\n"
        "        if name.split('.')[0] == 'uvicorn':\n"
        "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
        "sys.meta_path.insert(0, Absent())\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH")) if p)}
    assert missing_server_module(env=env) == ("uvicorn", "ModuleNotFoundError: No module named 'uvicorn'")
    assert missing_server_module("flashinfer", env=env)[0] == "uvicorn"  # the common ones first


@pytest.mark.skipif(_ERR is not None, reason=_ERR or "")
def test_server_modules_import_without_what_the_bundle_leaves_out():
    """core leaves IPython's optional parts out (gpu_bundle.sh IPYTHON_UNUSED): the server's modules must import with
    them blocked (sgl_kernel is the CPU stand-in here; on the GPU the real one)."""
    blocked = [line for line in subprocess.run(["bash", str(SCRIPT), "--list", "ipython_unused"],
                                               capture_output=True, text=True, check=True).stdout.split()]
    assert "jedi" in blocked
    code = f"""
import importlib, importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in {blocked!r}:
            raise ImportError("left out of the bundle: " + name)
sys.meta_path.insert(0, Block())
from tests.doubles import sgl_kernel_standin
with sgl_kernel_standin.installed():
    for m in {SERVER_MODULES!r}:
        importlib.import_module(m)
print("imported", len({SERVER_MODULES!r}))
"""
    out = subprocess.run([sys.executable, "-W", "ignore", "-c", code], capture_output=True, text=True, timeout=600,
                         env={**os.environ, "SGLANG_USE_CPU_ENGINE": "0"})
    assert out.returncode == 0 and f"imported {len(SERVER_MODULES)}" in out.stdout, out.stderr[-3000:]


@pytest.mark.skipif(_ERR is not None, reason=_ERR or "")
@pytest.mark.slow  # over 30 s (--durations, issue 25)
def test_every_distribution_a_live_server_imports_is_on_the_gpu_machine_or_carried():
    """Import the server's modules here, map every module they load to its distribution, and require each to be in
    the lent machine's image (scripts/gpu_image_packages.txt) or in a bundle group. A missing one is a server that
    dies at start on the GPU (fastapi 0.163 importing opentelemetry was one); sgl_kernel is the CPU stand-in here."""
    code = f"""
import importlib, importlib.metadata as md, json, sys
from tests.doubles import sgl_kernel_standin
before = set(sys.modules)
with sgl_kernel_standin.installed():
    for m in {SERVER_MODULES!r}:
        importlib.import_module(m)
import os
owner = {{}}  # installed file -> its distribution (namespace packages such as google.* span several)
for d in md.distributions():
    for f in d.files or []:
        owner[os.path.realpath(d.locate_file(f))] = d.metadata["Name"]
used = set()
for name, mod in list(sys.modules.items()):
    path = getattr(mod, "__file__", None)
    if name in before or name.split(".")[0] in sys.stdlib_module_names or not path:
        continue
    if "/setuptools/_vendor/" in path:  # setuptools' own vendored copies (its distutils puts them on sys.path)
        dist = "setuptools"
    else:
        dist = owner.get(os.path.realpath(path))
    if dist:  # a file no distribution owns (torch's pseudo-modules, sysconfig data) is not carried either way
        used.add(dist)
print(json.dumps(sorted(used)))
"""
    out = subprocess.run([sys.executable, "-W", "ignore", "-c", code], capture_output=True, text=True, timeout=600,
                         env={**os.environ, "SGLANG_USE_CPU_ENGINE": "0"})
    assert out.returncode == 0, out.stderr[-3000:]
    imported = {_norm(d) for d in __import__("json").loads(out.stdout.strip().splitlines()[-1])}
    image = {_norm(line) for line in (ROOT / "scripts/gpu_image_packages.txt").read_text().splitlines()
             if line.strip() and not line.startswith("#")}
    carried = {_norm(n) for g in LIVE for n in pins(g, sglang_cpu.SGLANG_VERSION)}  # the importable release's
    # top_rl's own modules, and wandb (+ its platformdirs): megatron.core imports it only if installed, and sglang's
    # debug dumper imports megatron.core only if installed (both inside try blocks)
    optional = {"top-rl", "wandb", "platformdirs"}
    missing = sorted(imported - image - carried - optional)
    assert not missing, f"a live server imports {missing}, which neither the GPU image nor scripts/gpu_bundle.sh has"


def test_an_fa3_pack_larger_than_a_carry_is_split_into_groups_of_one_carry_each(tmp_path):
    """0.5.17's FA3 build packs to 126 MiB (xz -9e), more than a carry holds: gpu_bundle.sh cuts the cached pack into
    parts of one carry each, in groups fa3, fa3_2, ... (each with the digest), which the plan counts as carries and
    which join back to the cached bytes in order (gpu_run.sh joins them on the device)."""
    import hashlib

    (tmp_path / "tree").mkdir()
    tree = _copy(tmp_path / "tree")
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "sglang_kernel-0.4.5-cp310-abi3-manylinux2014_x86_64.whl").write_bytes(b"")  # found, never opened
    packed = cache / "sglang_kernel-0.4.5-cp310-abi3-manylinux2014_x86_64.flash_ops.so.xz"
    with open(packed, "wb") as f:  # 130 MiB, marked at the ends of the parts so that their order shows
        f.truncate(130 << 20)
        for at in (0, 59 << 20, 61 << 20, (130 << 20) - 7):
            f.seek(at)
            f.write(os.urandom(7))
    (cache / (packed.name + ".sha256")).write_text("ab 1 sgl_kernel/flash_ops.abi3.so w.whl\n")
    out = subprocess.run(["bash", str(tree / "scripts/gpu_bundle.sh"), "--release", "0.5.17", "fa3"], capture_output=True,
                         text=True, timeout=120, env={**os.environ, "PYTHON": str(tree / "python"),
                                                      "GIT_DIR": str(tree / "no-git"), "SGLANG_KERNEL_CACHE": str(cache)})
    assert out.returncode == 0, out.stderr
    groups = sorted(p.name for p in (tree / ".gpu_bundle").iterdir() if p.is_dir())
    assert groups == ["fa3", "fa3_2", "fa3_3"]
    parts = [next((tree / ".gpu_bundle" / g).glob("flash_ops.so.xz.part*")) for g in groups]
    assert [p.name for p in parts] == [f"flash_ops.so.xz.part{i}-of-3" for i in (1, 2, 3)]
    assert all((tree / ".gpu_bundle" / g / "flash_ops.so.xz.sha256").is_file() for g in groups)
    joined = hashlib.sha256(b"".join(p.read_bytes() for p in parts)).hexdigest()
    assert joined == hashlib.sha256(packed.read_bytes()).hexdigest()
    assert "gpu bundle: carry 3 of 3" in out.stdout and "carry 4" not in out.stdout
