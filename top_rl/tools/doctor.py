"""`top-rl doctor`: is this machine's GPU stack the one a TOP contract was proven with? (issue 53 item 1)

The trainer imports the engine's own kernels, so torch, sglang, sglang-kernel and flashinfer must be the exact builds
the SGLang release pins (its wheel's Requires-Dist, kept as `SglangRelease.gpu_pins`), on a GPU and driver that can
run them. A wrong one surfaces today minutes into a run (an import error in an actor, a kernel that will not load, a
parity gate that fails). The doctor reads what is installed and what the GPU is, in seconds and before Ray: nothing
is imported but metadata (torch's CUDA version is read from its version.py; the GPU from nvidia-smi), nothing is
written. Each line is one check: ok, or what was found, what the contract wants, and the command that fixes it.

Two parts, so tests can drive the rules with stand-in facts: `gather()` reads the machine, `diagnose()` judges facts.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from top_rl.tools.args import Arg, KeyValueCli, UsageError

# NVIDIA's minimum Linux driver for a CUDA major version under minor-version compatibility (CUDA Toolkit release
# notes, "CUDA Toolkit and Minimum Required Driver Version"): a torch built for CUDA 12.x loads on >= 525.60.13.
MIN_DRIVER = {12: "525.60.13", 13: "580.65.06"}
MIN_ARCH = (8, 0)  # bf16 and the Triton kernels both sides run (Ampere and newer)
MEGATRON = ("megatron-core", "0.19")  # pyproject: megatron-core>=0.19,<0.20


def extra_for(version: str) -> str:
    """The pyproject extra that installs release `version`'s GPU stack: sglang0511 for 0.5.11."""
    return "sglang" + version.replace(".", "")


def install_fix(version: str) -> str:
    return f"pip install -e '.[{extra_for(version)}]' in the TOP-RL checkout (README, GPU install)"


@dataclass
class Facts:
    """What `gather()` read: distribution versions (None: not installed), torch's CUDA version (None: a CPU build or
    no torch), and each GPU as (name, compute capability 'X.Y', driver version); gpu_error says why none was read."""
    python: tuple[int, int]
    versions: dict[str, str | None]
    torch_cuda: str | None
    gpus: list[tuple[str, str, str]] = field(default_factory=list)
    gpu_error: str | None = None


@dataclass
class Check:
    name: str
    ok: bool
    line: str
    warn: bool = False  # runs, but outside what was proven: reported, not a failure

    def render(self) -> str:
        return f"{'ok  ' if self.ok else 'warn' if self.warn else 'FAIL'}  {self.name}: {self.line}"


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _torch_cuda() -> str | None:
    """torch.version.cuda without importing torch (seconds, not the import's tens of seconds on a cold disk)."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(spec.submodule_search_locations[0]) / "version.py"
    m = re.search(r"^cuda(?::\s*\S+)?\s*=\s*['\"]([0-9.]+)['\"]", path.read_text() if path.exists() else "", re.M)
    return m.group(1) if m else None


def _gpus() -> tuple[list[tuple[str, str, str]], str | None]:
    if not shutil.which("nvidia-smi"):
        return [], "nvidia-smi not found (no NVIDIA driver on this machine)"
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,compute_cap,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as e:
        return [], f"nvidia-smi failed: {e}"
    if out.returncode != 0:
        return [], f"nvidia-smi failed: {(out.stderr or out.stdout).strip().splitlines()[-1:] or out.returncode}"
    gpus = [tuple(x.strip() for x in line.split(",")) for line in out.stdout.strip().splitlines() if line.strip()]
    return [g for g in gpus if len(g) == 3], None if gpus else "nvidia-smi lists no GPU"


def gather(release) -> Facts:
    names = ["sglang", "torch", "megatron-core", *(n for n, _ in release.gpu_pins)]
    gpus, err = _gpus()
    return Facts(python=sys.version_info[:2], versions={n: _version(n) for n in dict.fromkeys(names)},
                 torch_cuda=_torch_cuda(), gpus=gpus, gpu_error=err)


def _vtuple(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", v))


def diagnose(facts: Facts, contract) -> list[Check]:
    """Every check of `facts` against `contract` (its SGLang release's pins, GEMM path and proven GPUs)."""
    release = contract.release
    v, fix = release.version, install_fix(release.version)
    out = [Check("python", facts.python == (3, 12),
                 "3.12" if facts.python == (3, 12) else f"found {facts.python[0]}.{facts.python[1]}, TOP-RL needs "
                 "3.12; fix: make the venv with python3.12")]
    have = facts.versions.get("sglang")
    out.append(Check("sglang", have == v, f"{v}" if have == v else
                     f"{'not installed' if have is None else 'found ' + have}, contract {contract.name} is SGLang "
                     f"{v}; fix: {fix}"))
    for dist, want in release.gpu_pins:
        have = facts.versions.get(dist)
        base = have.split("+")[0] if have else None  # torch's local version (+cu128) is the CUDA build, checked below
        out.append(Check(dist, base == want, have if base == want else
                         f"{'not installed' if have is None else 'found ' + have}, SGLang {v} pins {want}; fix: {fix}"))
    have = facts.versions.get(MEGATRON[0])
    good = have is not None and have.split(".")[:2] == MEGATRON[1].split(".")
    out.append(Check(MEGATRON[0], good, have if good else f"{'not installed' if have is None else 'found ' + have}, "
                     f"TOP-RL needs {MEGATRON[1]}.x; fix: {fix}"))
    cuda = facts.torch_cuda
    out.append(Check("torch CUDA build", cuda is not None, f"CUDA {cuda}" if cuda else
                     f"torch {facts.versions.get('torch') or '(not installed)'} is a CPU build (torch.version.cuda is "
                     f"None); fix: {fix}"))
    if not facts.gpus:
        out.append(Check("GPU", False, f"none: {facts.gpu_error}; a TOP run with SGLang needs an NVIDIA GPU "
                         f"(sm{MIN_ARCH[0]}{MIN_ARCH[1]} or newer) and its driver"))
        return out
    for i, (name, cap, driver) in enumerate(facts.gpus):
        arch = "sm" + cap.replace(".", "")
        try:
            cap_t = tuple(int(x) for x in cap.split("."))
        except ValueError:
            cap_t = (0, 0)
        if cap_t < MIN_ARCH:
            out.append(Check(f"GPU {i}", False, f"{name} is {arch}; the contract's kernels need "
                             f"sm{MIN_ARCH[0]}{MIN_ARCH[1]} or newer (bf16); fix: run on an Ampere or newer GPU"))
        elif contract.gemm == "deepgemm" and cap_t[0] != 9:
            out.append(Check(f"GPU {i}", False, f"{name} is {arch}; contract {contract.name} runs DeepGEMM's "
                             "sm90 kernels; fix: top.contract=" + contract.name.replace("_deepgemm", "")
                             + " (the Triton GEMM) or a Hopper GPU"))
        elif arch not in release.proven_archs:
            out.append(Check(f"GPU {i}", False, f"{name} ({arch}): runs, but contract {contract.name} was proven on "
                             f"{', '.join(release.proven_archs)} only; check parity on day one "
                             "(top-rl-parity-probe)", warn=True))
        else:
            out.append(Check(f"GPU {i}", True, f"{name} ({arch}, proven)"))
        major = _vtuple(cuda)[0] if cuda else None
        need = MIN_DRIVER.get(major) if major else None
        if need is None:
            out.append(Check(f"GPU {i} driver", cuda is None, f"{driver}" + ("" if cuda is None else
                             f"; no known minimum for CUDA {cuda}"), warn=cuda is not None))
        elif _vtuple(driver) < _vtuple(need):
            out.append(Check(f"GPU {i} driver", False, f"{driver} is older than {need}, the minimum for torch's "
                             f"CUDA {cuda}; fix: update the NVIDIA driver to >= {need}"))
        else:
            out.append(Check(f"GPU {i} driver", True, f"{driver} (CUDA {cuda} needs >= {need})"))
    return out


CLI = KeyValueCli(
    "top-rl doctor",
    "Check the installed GPU stack (torch, sglang, sglang-kernel, flashinfer, megatron-core) and the GPU's architecture "
    "and driver against a TOP contract, before anything starts. Exit 0: every check passes (warnings allowed); 1: "
    "each failing check is named with its fix.",
    [Arg("contract", "the contract to check against; default: that of the installed SGLang release, else "
                     "qwen3_dense_top_v1 (SGLang 0.5.11)")],
)


def _contract(name: str | None):
    from top_rl import contract

    if name:
        if name not in contract.CONTRACTS:
            raise UsageError(f"contract={name!r}: expected one of {', '.join(contract.CONTRACTS)}")
        return contract.CONTRACTS[name]
    return contract.fallback()  # the installed release's contract (DEFAULT's where none is installed)


def main(argv: list[str]) -> int:
    try:
        args = CLI.parse(argv)
        if args is None:  # --help
            return 0
        top = _contract(args.contract)
    except UsageError as e:
        print(f"top-rl doctor: {e}\n{CLI.usage()}", file=sys.stderr)
        return 2
    checks = diagnose(gather(top.release), top)
    print(f"top-rl doctor: contract {top.name} (SGLang {top.sglang_version})")
    for c in checks:
        print(c.render())
    bad = [c.name for c in checks if not c.ok and not c.warn]
    print(f"top-rl doctor: {len(bad)} problem(s){': ' + ', '.join(bad) if bad else ''}", flush=True)
    return 1 if bad else 0
