"""What each SGLang release moves, behind one adapter per release (issue 33 item 2).

TOP-RL reaches into SGLang's internals in a few places: the trainer imports the engine's Triton attention kernels, the
seeded sampler loads SGLang's murmur-hash file, the launch check reads argparse dests of SGLang's own parser, the
protocol copies a meta_info key, the log filter names a logger, and the CPU test helper publishes a global ServerArgs.
Those names differ between releases; everything that differs lives in one `SglangRelease` here, chosen once from
`RELEASES` by the release a contract names (`contract.TopContract.sglang_version`) or the one installed. A third
release is one new adapter here, one contract in top_rl/contract.py and its numerics page (docs/numerics_<v>.md).

Plain data (no torch, no sglang import): the config and the entry layer read it before anything heavy is imported.
"""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys

from top_rl.sglang_release import sglang_0_5_11, sglang_0_5_17
from top_rl.sglang_release.base import SglangRelease

# One adapter per release, one module each (a third release: one more module here)
RELEASES: dict[str, SglangRelease] = {m.RELEASE.version: m.RELEASE for m in (sglang_0_5_11, sglang_0_5_17)}


def supported() -> str:
    """The releases TOP-RL has a contract for, as a user reads them."""
    state = {"proven": "proven on a GPU", "built": "built from its source, not yet proven on a GPU"}
    return ", ".join(f"{v} ({state[r.status]})"
                     for v, r in RELEASES.items())


def get(version: str) -> SglangRelease:
    """The adapter of `version`; any other release is refused, naming the ones TOP-RL has a contract for."""
    try:
        return RELEASES[version]
    except KeyError:
        raise ValueError(f"top-rl: SGLang {version} has no TOP contract; the releases with one are {supported()}: "
                         f"install one of them (scripts/install.sh, the Docker image) or run top.enabled=false"
                         ) from None


def installed_version(python: str | None = None) -> str | None:
    """The sglang release `python` imports (this interpreter when None or the same: its first distribution on
    sys.path; another one is asked in a subprocess); None when absent. The one reader of the installed release: the
    contract's fallback, the engine's version refusal and the dry run all ask here."""
    if python in (None, "", sys.executable):
        try:
            return importlib.metadata.version("sglang")
        except importlib.metadata.PackageNotFoundError:
            return None
    code = "import importlib.metadata as m\ntry: print(m.version('sglang'))\nexcept m.PackageNotFoundError: pass"
    try:
        out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ValueError(f"top-rl: cannot run the configured python {python!r} to read its sglang version: {e}; "
                         f"set rollout.sglang.python to an interpreter that runs") from None
    return out.stdout.strip() or None


def installed() -> SglangRelease:
    """The adapter of the release this interpreter holds (refused when it has none or an unknown one)."""
    version = installed_version()
    if version is None:
        raise ValueError(f"top-rl: sglang is not installed here; the releases with a TOP contract are {supported()}")
    return get(version)


__all__ = ["RELEASES", "SglangRelease", "get", "installed", "installed_version", "supported"]
