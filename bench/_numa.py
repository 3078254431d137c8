"""Pin a benchmark process to the CPU cores local to its GPU (the NUMA node the GPU's PCI device reports), so a host
launch or copy never crosses the socket interconnect mid-measurement. Linux sysfs: the device's `local_cpulist`.
Where the machine reports no locality (a VM that exposes one node, no sysfs entry) nothing is pinned and the note says
so: a bench prints what it did either way."""

from __future__ import annotations

import os
from pathlib import Path

SYSFS_PCI = Path("/sys/bus/pci/devices")


def parse_cpulist(text: str) -> list[int]:
    """'0-3,8,10-11' -> [0, 1, 2, 3, 8, 10, 11] (the kernel's cpulist format)."""
    cpus: list[int] = []
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        cpus += range(int(lo), int(hi or lo) + 1)
    return cpus


def pci_address(domain: int, bus: int, device: int) -> str:
    """sysfs's name of a GPU's PCI function 0, from torch.cuda.get_device_properties' pci_{domain,bus,device}_id."""
    return f"{domain:04x}:{bus:02x}:{device:02x}.0"


def pin_to_gpu(index: int = 0, sysfs: Path = SYSFS_PCI) -> str:
    """Restrict this process to GPU `index`'s local cores; returns the note a bench prints."""
    import torch

    props = torch.cuda.get_device_properties(index)
    address = pci_address(props.pci_domain_id, props.pci_bus_id, props.pci_device_id)
    return pin_to(sysfs / address / "local_cpulist", f"GPU {index} ({address})")


def pin_to(cpulist_file: Path, what: str) -> str:
    try:
        local = parse_cpulist(Path(cpulist_file).read_text())
    except OSError as e:
        return f"not pinned: {what} reports no local cores ({type(e).__name__})"
    allowed = sorted(os.sched_getaffinity(0))
    cpus = sorted(set(local) & set(allowed))
    if not cpus or cpus == allowed:
        return f"not pinned: {what}'s local cores {local} are all of this process's {len(allowed)}"
    os.sched_setaffinity(0, cpus)
    return f"pinned to {what}'s {len(cpus)} local cores (of {len(allowed)}): {cpus[0]}-{cpus[-1]}"
