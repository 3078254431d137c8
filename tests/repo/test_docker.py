"""The Dockerfile (issue 53 item 1), checked on CPU since no machine here builds it: one lock per SGLang release with a
contract, pinning every package TOP-RL itself needs; the Dockerfile's list of the base image's protected packages equal
to the lock script's (else a lock could pin what the image pins, and the build would fail resolving); its header in
line with the README on which releases are proven."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from top_rl import sglang_release

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = (ROOT / "Dockerfile").read_text()
spec = importlib.util.spec_from_file_location("docker_lock", ROOT / "scripts" / "docker_lock.py")
docker_lock = importlib.util.module_from_spec(spec)
spec.loader.exec_module(docker_lock)


def lock(version: str) -> dict[str, str]:
    lines = docker_lock.lock_path(version).read_text().splitlines()
    return {re.sub(r"[-_.]+", "-", ln.split("==")[0].lower()): ln.split("==")[1] for ln in lines if "==" in ln}


@pytest.mark.parametrize("version", sorted(sglang_release.RELEASES))
def test_each_release_has_a_lock_of_what_top_rl_installs(version):
    got = lock(version)
    for dist in ("megatron-core", "ray", "hydra-core", "omegaconf", "wandb", "math-verify", "psutil", "requests"):
        assert dist in got, f"requirements/docker-sglang-{version}.lock does not pin {dist}"
    assert got["megatron-core"].startswith("0.19.")
    protected = [d for d in got if re.match(docker_lock.PROTECTED, f"{d}==", re.I)]
    assert not protected, f"the lock pins what the base image pins itself: {protected}"


def test_dockerfile_protects_what_the_lock_script_leaves_out_and_uses_the_lock():
    grep = re.search(r"grep -iE '([^']+)'", DOCKERFILE).group(1)
    assert grep == docker_lock.PROTECTED
    assert "-c requirements/docker-sglang-${SGLANG_VERSION}.lock -e ." in DOCKERFILE
    assert "--lock requirements/docker-sglang-${SGLANG_VERSION}.lock --before /opt/top-rl-base-freeze.txt" in DOCKERFILE
    assert re.search(r"^ARG SGLANG_VERSION=0\.5\.11$", DOCKERFILE, re.M)


def test_dockerfile_header_agrees_with_the_readme_on_proven_releases():
    header = "".join(ln for ln in DOCKERFILE.splitlines(True) if ln.startswith("#"))
    for version, release in sglang_release.RELEASES.items():
        assert f"SGLANG_VERSION={version}" in header or f"sglang-{version}" in header
        if release.status == "proven":
            assert not re.search(rf"{re.escape(version)}[^\n]*(NOT yet proven|unproven)", header, re.I), version
