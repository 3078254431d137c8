"""bench/_numa.py: a bench worker pins itself to its GPU's NUMA-local cores (sysfs `local_cpulist`), and says so; on a
machine that reports no locality it pins nothing and says that. A fake sysfs file stands in for the GPU's here."""

from __future__ import annotations

import os

import pytest

from bench import _numa


def test_cpulists_and_pci_addresses_read_as_the_kernel_writes_them():
    assert _numa.parse_cpulist("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]
    assert _numa.parse_cpulist("5") == [5]
    assert _numa.pci_address(0, 0x1B, 0) == "0000:1b:00.0"


@pytest.fixture
def restore_affinity():
    before = os.sched_getaffinity(0)
    yield sorted(before)
    os.sched_setaffinity(0, before)


def test_pins_to_the_local_cores_it_may_use_and_only_then(tmp_path, restore_affinity):
    allowed = restore_affinity
    cpulist = tmp_path / "local_cpulist"
    if len(allowed) > 1:
        cpulist.write_text(f"{allowed[0]}\n")
        note = _numa.pin_to(cpulist, "GPU 0")
        assert os.sched_getaffinity(0) == {allowed[0]} and note.startswith("pinned to GPU 0's 1 local cores")
        os.sched_setaffinity(0, allowed)
    cpulist.write_text(",".join(map(str, allowed)))  # every core is local: nothing to pin
    assert _numa.pin_to(cpulist, "GPU 0").startswith("not pinned") and sorted(os.sched_getaffinity(0)) == allowed
    assert "reports no local cores" in _numa.pin_to(tmp_path / "absent", "GPU 0")
    assert sorted(os.sched_getaffinity(0)) == allowed
