"""The whole RL loop with `rollout.engine=sglang`, on CPU: Ray, the Megatron trainer, and an engine actor that
launches `python -m sglang.launch_server ...` with the contract's flags, where the configured `python` is a wrapper
that runs the STAND-IN server (tests/doubles/sglang_standin.py: SGLang's own HTTP app and tokenizer manager in
front of a stand-in scheduler; not SGLang) with those flags. What this covers, which a live server on a GPU covers
again (tests/gpu/test_sglang_live.py, scripts/gpu_run.sh e2e): a run without model.path writes its random initial
policy for the server to start from, every weight push goes over the HTTP protocol (by disk, what auto picks on CPU,
and by SGLang's update_weights_from_distributed over gloo, cluster.weight_transport=broadcast), the prefill source
is re-scored by the server, and the gate holds (abs_diff 0, ESS 1) on every step.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import sglang_cpu
from tests.startup_lines import assert_started

_ERR = sglang_cpu.import_error()
pytestmark = [pytest.mark.skipif(_ERR is not None, reason=_ERR or ""), pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]  # tests.doubles lives in the repository, not the package


def _wrapper(root: Path) -> Path:
    """A `python` that runs the stand-in for `-m sglang.launch_server`, the real interpreter otherwise. It keeps the
    caller's PYTHONPATH: with another release on it (CI's .sglang0517), the stand-in serves the release whose contract
    the driver took."""
    w = root / "python"
    w.write_text(f'#!/bin/sh\nif [ "$1" = "-m" ] && [ "$2" = "sglang.launch_server" ]; then\n  shift 2\n'
                 f'  exec env PYTHONPATH={ROOT}${{PYTHONPATH:+:$PYTHONPATH}} {sys.executable} -m tests.doubles.sglang_standin "$@"\n'
                 f'fi\nexec {sys.executable} "$@"\n')
    w.chmod(0o755)
    return w


@pytest.mark.parametrize("transport", ["auto", "broadcast"])
def test_rl_loop_on_an_sglang_engine_from_a_random_initial_policy(tmp_path, transport):
    run_dir = tmp_path / "run"
    env = {**os.environ, "WANDB_MODE": "disabled", "WANDB_SILENT": "true"}
    out = subprocess.run(
        [sys.executable, "-m", "top_rl.cli", f"run_dir={run_dir}", "steps=2", "rollout=sglang",
         "rollout.max_new_tokens=2", "rollout.prompts_per_step=4", "rollout.n_samples=4", "cluster.torch_threads=1",
         f"rollout.sglang.python={_wrapper(tmp_path)}", f"rollout.sglang.weights_dir={tmp_path / 'weights'}",
         f"cluster.weight_transport={transport}"],
        capture_output=True, text=True, timeout=600, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert r["train/train_rollout_logprob_abs_diff"] == 0.0 and r["train/ess_ratio"] == 1.0, r
    initial = run_dir / "initial_policy"
    assert json.loads((initial / "config.json").read_text())["architectures"] == ["Qwen3ForCausalLM"]
    if transport == "auto":  # on CPU: disk. One weight version per push (start, then after each step), each reloaded
        assert sorted(p.name for p in (tmp_path / "weights").glob("v*")) == ["v000002", "v000003"]  # keep_weight_versions=2
    else:  # nothing written: every bucket went over the group
        assert not list((tmp_path / "weights").glob("v*"))
    # issue 53 item 3: the server's log is this run's, under run_dir/logs/, named in its start-up line
    logs = assert_started(out.stdout, run_dir)
    (server_log,) = logs.glob("sglang-0-port*.log")
    assert f"SGLang server on http://127.0.0.1:" in out.stdout and f"log {server_log}" in out.stdout
    assert "===== top-rl start #1" in server_log.read_text()
    # step 2's gate held: the server computed with the weights step 1 trained, so the push reached it


def test_gpu_handoff_releases_the_server_for_the_step_and_the_push_restores_it(tmp_path):
    """cluster.gpu_handoff=true: around every training step the server gives its memory back and takes it again, and
    the weight push follows the resume. The stand-in fills its weights with NaN on release and refuses to generate
    while released, so a push before the resume, or a rollout before the push, fails the run (the gate or the engine);
    its log names each call and whether the server was idle."""
    run_dir = tmp_path / "run"
    env = {**os.environ, "WANDB_MODE": "disabled", "WANDB_SILENT": "true"}
    log = tmp_path / "server.log"
    out = subprocess.run(
        [sys.executable, "-m", "top_rl.cli", f"run_dir={run_dir}", "steps=3", "rollout=sglang",
         "rollout.max_new_tokens=2", "rollout.prompts_per_step=4", "rollout.n_samples=4", "cluster.torch_threads=1",
         f"rollout.sglang.python={_wrapper(tmp_path)}", f"rollout.sglang.log_path={log}", "cluster.gpu_handoff=true"],
        capture_output=True, text=True, timeout=600, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    for r in rows:
        assert r["train/train_rollout_logprob_abs_diff"] == 0.0 and r["train/ess_ratio"] == 1.0, r
        assert r["perf/gpu_handoff_time"] > 0
    events = [line.split("stand-in memory: ", 1)[1] for line in log.read_text().splitlines() if "stand-in memory: " in line]
    assert events == ["release idle=True", "resume idle=True"] * 3


def test_a_lagged_run_on_an_sglang_engine_is_gated_under_the_servers_reported_versions(tmp_path):
    """rollout.policy_lag=1 against the stand-in server: the samples' versions are the server's own weight_version
    (SGLang's meta_info), each batch is one version behind the trainer, and the gate holds under the trainer's copy
    of that version (the server's prefill re-scores are the numbers compared)."""
    run_dir = tmp_path / "run"
    env = {**os.environ, "WANDB_MODE": "disabled", "WANDB_SILENT": "true"}
    out = subprocess.run(
        [sys.executable, "-m", "top_rl.cli", f"run_dir={run_dir}", "steps=3", "rollout=sglang", "rollout.policy_lag=1",
         "rollout.max_new_tokens=2", "rollout.prompts_per_step=4", "rollout.n_samples=4", "cluster.torch_threads=1",
         f"rollout.sglang.python={_wrapper(tmp_path)}", f"rollout.sglang.weights_dir={tmp_path / 'weights'}"],
        capture_output=True, text=True, timeout=600, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    for r in rows:
        assert r["train/train_rollout_logprob_abs_diff"] == 0.0 and r["train/ess_ratio"] == 1.0, r
    assert [r["train/policy_lag"] for r in rows] == [0, 1, 1]
    assert [r["train/behaviour_version"] for r in rows] == [1, 1, 2]
