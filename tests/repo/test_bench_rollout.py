"""bench/rollout.py on CPU (--cpu-smoke, a tiny model, reference kernels): the script runs the native engine and prints
its table; its numbers on the H200 are in bench/RESULTS.md. And the roofline's byte count against the model's own
parameters."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_cpu_smoke_prints_the_table():
    proc = subprocess.run([sys.executable, "bench/rollout.py", "--cpu-smoke"], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    table = proc.stdout.split("### rollout:")[1]
    rows = re.findall(r"^\|\s+tiny \| native \| eager \|\s+(\d+) \|\s+([0-9.]+) \|\s+([0-9.-]+) \|", table, re.M)
    assert [int(b) for b, _, _ in rows] == [1, 8], table
    assert all(float(tps) > 0 for _, tps, _ in rows), table


def test_roofline_bytes_are_every_weight_once_plus_the_kv_cache():
    from bench.rollout import decode_step_bytes
    from top_rl.model import Qwen3
    from bench._trainer_common import MODELS

    cfg = MODELS["tiny"]
    model = Qwen3(cfg, "bfloat16")
    want = sum(p.numel() * (2 if p.dim() == 2 else 4) for p in model.parameters())  # the tied head read as bf16
    assert decode_step_bytes(cfg, batch=0, mean_len=0) == want
    kv_per_token = cfg.num_hidden_layers * 2 * cfg.num_key_value_heads * cfg.head_dim * 2
    assert decode_step_bytes(cfg, batch=3, mean_len=10) - want == 3 * 10 * kv_per_token
    assert round(decode_step_bytes(MODELS["qwen3-0.6b"], 0, 0) / 1e9, 3) == 1.192  # 596M bf16 weights, head included
