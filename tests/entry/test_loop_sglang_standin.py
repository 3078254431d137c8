"""The whole RL loop with `rollout.engine=sglang`, on CPU: Ray, the Megatron trainer, and an engine actor that
launches `python -m sglang.launch_server ...` with the contract's flags, where the configured `python` is a wrapper
that runs the STAND-IN server (tests/doubles/sglang_standin.py: SGLang's own HTTP app and tokenizer manager in
front of a stand-in scheduler; not SGLang) with those flags. What this covers, which a live server on a GPU covers
again (tests/gpu/test_sglang_live.py, scripts/gpu_run.sh e2e): a run without model.path writes its random initial
policy for the server to start from, every weight push goes over the HTTP protocol (disk sync), the prefill source
is re-scored by the server, and the gate holds (abs_diff 0, ESS 1) on every step.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import sglang_cpu  # noqa: E402

_ERR = sglang_cpu.import_error()
pytestmark = [pytest.mark.skipif(_ERR is not None, reason=_ERR or ""), pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]  # tests.doubles lives in the repository, not the package


def _wrapper(root: Path) -> Path:
    """A `python` that runs the stand-in for `-m sglang.launch_server`, the real interpreter otherwise."""
    w = root / "python"
    w.write_text(f'#!/bin/sh\nif [ "$1" = "-m" ] && [ "$2" = "sglang.launch_server" ]; then\n  shift 2\n'
                 f'  exec env PYTHONPATH={ROOT} {sys.executable} -m tests.doubles.sglang_standin "$@"\nfi\nexec {sys.executable} "$@"\n')
    w.chmod(0o755)
    return w


def test_rl_loop_on_an_sglang_engine_from_a_random_initial_policy(tmp_path):
    run_dir = tmp_path / "run"
    env = {**os.environ, "WANDB_MODE": "disabled", "WANDB_SILENT": "true"}
    out = subprocess.run(
        [sys.executable, "-m", "top_rl.cli", f"run_dir={run_dir}", "steps=2", "rollout=sglang",
         "rollout.max_new_tokens=2", "rollout.prompts_per_step=4", "rollout.n_samples=4", "cluster.torch_threads=1",
         f"rollout.sglang.python={_wrapper(tmp_path)}", f"rollout.sglang.weights_dir={tmp_path / 'weights'}"],
        capture_output=True, text=True, timeout=600, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert r["train/train_rollout_logprob_abs_diff"] == 0.0 and r["train/ess_ratio"] == 1.0, r
    initial = run_dir / "initial_policy"
    assert json.loads((initial / "config.json").read_text())["architectures"] == ["Qwen3ForCausalLM"]
    # one weight version per push (start, then after each step), each loaded by the server over HTTP
    assert sorted(p.name for p in (tmp_path / "weights").glob("v*")) == ["v000002", "v000003"]  # keep_weight_versions=2
