"""bench/host_time.py on CPU (--cpu-smoke, a tiny model): the script runs both trainers and prints its tables. Its
numbers on the H200 are in bench/RESULTS.md; here only that it works, in a subprocess (each trainer sets up its own
process group and kernel backend)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # over 30 s (--durations, issue 25)
@pytest.mark.parametrize("impl", ["top", "stock"])
def test_cpu_smoke_prints_the_step_and_the_profile(impl):
    proc = subprocess.run([sys.executable, "bench/host_time.py", "--cpu-smoke", "--impl", impl, "--top", "4"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout
    assert f"# host time, tiny {impl}, recompute on" in out
    step = re.search(r"^\| ([0-9.]+) \| ([0-9.]+) \|$", out, re.M)
    assert step and float(step.group(1)) > 0 and float(step.group(2)) > 0
    table = out.split("cProfile)")[1]
    rows = [line for line in table.splitlines() if line.startswith("| ") and not line.startswith("| function")]
    assert len(rows) == 4, table
