"""Write requirements/docker-sglang-<v>.lock: the exact version of every Python package the Docker image may install on
top of the SGLang release image (issue 53 item 1: the Dockerfile pins every package it installs).

The lock is what pip resolves, from PyPI, for this package with the release's GPU extra (`.[sglang0511]`: the release,
its wheel's pins, megatron-core, ray, hydra, wandb, ...), minus what the base image already pins and the Dockerfile
keeps as constraints (PROTECTED, the same list as its `pip freeze | grep`): those stay the image's. Resolved with a pip
that reads PyPI's metadata files, in a throwaway venv, so nothing is downloaded but metadata and nothing here changes.

    python scripts/docker_lock.py 0.5.11 [0.5.17]     (network; about two minutes a release)
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The Dockerfile's `pip freeze | grep -iE` of the base image's CUDA stack (kept equal by tests/repo/test_docker.py)
PROTECTED = r"^(torch|torchvision|torchaudio|triton|sglang|sgl[-_]kernel|sglang[-_]kernel|flashinfer[-_a-z]*|nvidia-[a-z0-9-]+|transformers|tokenizers|safetensors|numpy)=="


def lock_path(version: str) -> Path:
    return ROOT / "requirements" / f"docker-sglang-{version}.lock"


def resolve(version: str, venv: Path) -> dict[str, str]:
    report = venv.parent / f"report-{version}.json"
    extra = "sglang" + version.replace(".", "")
    subprocess.run([str(venv / "bin/python"), "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
                    "--report", str(report), f"{ROOT}[{extra}]"], check=True)
    got = {i["metadata"]["name"]: i["metadata"]["version"] for i in json.loads(report.read_text())["install"]}
    got.pop("top-rl", None)
    return got


def render(version: str, pins: dict[str, str]) -> str:
    kept = {n: v for n, v in pins.items() if not re.match(PROTECTED, f"{n}==", re.I)}
    head = (f"# The Docker image's lock for SGLang {version} (Dockerfile: a constraint file of the TOP-RL install), made by\n"
            f"# `python scripts/docker_lock.py {version}`: pip's resolution on PyPI of `.[sglang{version.replace('.', '')}]` "
            "for Linux\n# x86_64 Python 3.12, less the base image's own CUDA stack (torch, triton, sglang, sglang-kernel, "
            "flashinfer,\n# nvidia-*, transformers, tokenizers, safetensors, numpy), which the image pins itself.\n")
    return head + "".join(f"{n}=={v}\n" for n, v in sorted(kept.items(), key=lambda kv: kv[0].lower()))


def main(argv: list[str]) -> int:
    with tempfile.TemporaryDirectory(prefix="top-rl-docker-lock-") as tmp:
        venv = Path(tmp) / "venv"
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(venv / "bin/python"), "-m", "pip", "install", "-q", "pip>=25"], check=True)
        for version in argv or ["0.5.11"]:
            lock_path(version).write_text(render(version, resolve(version, venv)))
            print(f"docker_lock: wrote {lock_path(version).relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
