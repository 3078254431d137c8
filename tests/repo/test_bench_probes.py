"""bench/probes.py on CPU (--cpu-smoke: tiny shapes, `reference` kernels): the script prints its four rows. The
reference backend is proven batch- and decode-invariant on CPU, so here the rows must also read "equal"."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_cpu_smoke_prints_every_probe():
    proc = subprocess.run([sys.executable, "bench/probes.py", "--cpu-smoke"], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = {line.split("|")[1].strip(): line.split("|")[3].strip() for line in proc.stdout.splitlines()
            if line.startswith("| ") and "probe" not in line}
    assert list(rows) == ["stock GEMM row drift", "decode vs prefill", "compiled vs eager RoPE",
                          "sampler decode vs prefill"], proc.stdout
    assert rows["decode vs prefill"] == "1: equal; 7: equal; 40: equal", proc.stdout
    assert rows["compiled vs eager RoPE"].startswith("0/"), proc.stdout
    equal, total = rows["sampler decode vs prefill"].split()[0].split("/")
    assert equal == total and int(total) > 0, proc.stdout
