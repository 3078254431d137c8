"""bench/decode_repeat_probe.py on CPU (--cpu-smoke, a tiny model, reference kernels): both modes run and print their
tables, and on the CPU every repeat agrees (the probe is for the H200: issue 30 item 12)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _run(*flags: str) -> str:
    proc = subprocess.run([sys.executable, "bench/decode_repeat_probe.py", "--cpu-smoke", *flags], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def test_trace_mode_prints_every_call_of_the_test_module_in_order_and_every_pair():
    out = _run()
    rows = re.findall(r"^\| (\w+) \| [\d.]+ \| ([^|]+) \| ([^|]+) \|", out.split("every pair")[0], re.M)
    assert [r[0] for r in rows] == ["E64a", "Pa", "Pb", "G8", "Pc", "E64b", "E64c", "A0", "A17", "Alast", "G64"], out
    cells = [c.strip() for r in rows for c in r[1:]]
    assert set(cells) <= {"-", "none", "0 / 0"} and "none" in cells and "0 / 0" in cells, out
    matrix = re.findall(r"^\| (E64a|G8|E64b|E64c|A0|A17|Alast|G64) \| (.+) \|$", out.split("every pair")[1], re.M)
    assert len(matrix) == 8 and all(c.strip() in {".", "-", "0 / 0"} for _, r in matrix for c in r.split("|")), out
    assert "differing sample" not in out, out


def test_a_plan_and_profile_run():
    out = _run("--plan", "E4,G2,E2,A1,Alast", "--new", "3")
    assert re.findall(r"^\| (\w+) \| [\d.]+ \|", out, re.M)[:5] == ["E4", "G2", "E2", "A1", "Alast"], out
    prof = _run("--profile", "--eager")
    assert re.search(r"^\| eager step \| 5 \|", prof, re.M) and "cumulative" in prof, prof


def test_poison_mode_names_no_difference_on_the_cpu():
    out = _run("--poison")
    rows = re.findall(r"^\| (0\.0|nan|10000\.0) \| (\S+) \| .* \| (\d+ / \d+) \|$", out, re.M)
    assert {v for v, _, _ in rows} == {"0.0", "nan", "10000.0"}, out
    assert all(first == "none" and gen == "0 / 0" for _, first, gen in rows), out


def test_the_triton_scan_survives_a_dead_weak_proxy_in_the_gc():
    """On the H200 the scan over gc.get_objects() met a weakref proxy whose referent had died: isinstance raised
    ReferenceError and the trace stopped after its first call."""
    import weakref

    from bench import decode_repeat_probe as probe

    class Thing:
        pass

    thing = Thing()
    proxy = weakref.proxy(thing)
    del thing
    with pytest.raises(ReferenceError):
        isinstance(proxy, Thing)
    assert probe._isinstance_alive(proxy, Thing) is False
