"""GPU 0 of this machine as the driver sees it, read without creating a CUDA context (NVML, else nvidia-smi): its name,
compute capability and memory. The driver must not initialise CUDA (Ray's actors take the GPUs after it), so torch is
not asked. None where no GPU can be seen (a CPU machine, a cluster head without GPUs)."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass


@dataclass(frozen=True)
class LocalGpu:
    name: str  # e.g. "NVIDIA H100 80GB HBM3"
    capability: tuple[int, int]  # CUDA compute capability: (9, 0) Hopper, (10, 0) / (12, 0) Blackwell, (8, 0) Ampere
    total_bytes: int

    @property
    def arch(self) -> str:
        return f"sm{self.capability[0]}{self.capability[1]}"

    @property
    def is_hopper(self) -> bool:
        return self.capability[0] == 9

    def describe(self) -> str:
        return f"{self.name} ({self.arch})"


def _nvml() -> LocalGpu | None:
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - no NVML library, no driver
        return None
    try:
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        name = pynvml.nvmlDeviceGetName(h)
        return LocalGpu(name.decode() if isinstance(name, bytes) else str(name),
                        tuple(int(x) for x in pynvml.nvmlDeviceGetCudaComputeCapability(h)),
                        int(pynvml.nvmlDeviceGetMemoryInfo(h).total))
    except Exception:  # noqa: BLE001 - no GPU 0
        return None
    finally:
        pynvml.nvmlShutdown()


def _nvidia_smi() -> LocalGpu | None:
    if not shutil.which("nvidia-smi"):
        return None
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,compute_cap,memory.total", "--format=csv,noheader,nounits",
                              "-i", "0"], capture_output=True, text=True, timeout=30).stdout.strip()
        name, cap, mib = (p.strip() for p in out.splitlines()[0].rsplit(",", 2))
        major, minor = cap.split(".")
        return LocalGpu(name, (int(major), int(minor)), int(float(mib)) << 20)
    except (OSError, ValueError, IndexError, subprocess.TimeoutExpired):
        return None


def local_gpu() -> LocalGpu | None:
    return _nvml() or _nvidia_smi()
