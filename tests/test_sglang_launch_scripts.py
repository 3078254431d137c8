"""launch/: the Ray head/worker/submit scripts print the commands they would run (PRINT_ONLY=1), refuse the
contract's forbidden env, and submit.sh composes and checks the run config before using the cluster."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

LAUNCH = Path(__file__).resolve().parents[1] / "launch"
TOP_RL = Path(sys.executable).parent / "top-rl"


def _sh(script, *args, **env):
    full = {**os.environ, "PRINT_ONLY": "1", "NUM_GPUS": "8", "NODE_IP": "10.0.0.1", "WANDB_MODE": "offline", **env}
    for k in ("SGLANG_RETURN_ORIGINAL_LOGPROB", "RAY_ADDRESS"):
        if k not in env:
            full.pop(k, None)
    return subprocess.run(["bash", str(LAUNCH / script), *args], capture_output=True, text=True, env=full, timeout=300)


@pytest.mark.parametrize("script", ["ray_head.sh", "ray_worker.sh", "submit.sh", "_common.sh"])
def test_scripts_parse(script):
    assert subprocess.run(["bash", "-n", str(LAUNCH / script)]).returncode == 0


def test_head_and_worker_commands():
    out = _sh("ray_head.sh")
    assert out.returncode == 0, out.stderr
    assert "ray start --head --node-ip-address=10.0.0.1 --port=6379 --dashboard-host=0.0.0.0 --dashboard-port=8265 " \
           "--num-gpus=8 --disable-usage-stats" in out.stdout and "launch/ray_worker.sh 10.0.0.1:6379" in out.stdout
    out = _sh("ray_worker.sh", "10.0.0.1:6379", RAY_BLOCK="1")
    assert out.stdout.startswith("ray start --address=10.0.0.1:6379 --node-ip-address=10.0.0.1 --num-gpus=8")
    assert "--block" in out.stdout
    assert _sh("ray_worker.sh").returncode != 0  # the head address is required
    out = _sh("ray_head.sh", SGLANG_RETURN_ORIGINAL_LOGPROB="1")
    assert out.returncode == 2 and "unset SGLANG_RETURN_ORIGINAL_LOGPROB" in out.stderr


@pytest.mark.skipif(not TOP_RL.exists(), reason="the top-rl console script is not installed (pip install -e .)")
def test_submit_checks_the_config_then_submits():
    out = _sh("submit.sh", "+experiment=gsm8k_qwen3_0.6b", "steps=3", TOP_RL=str(TOP_RL), SUBMIT_NO_WAIT="1")
    assert out.returncode == 0, out.stderr
    line = out.stdout.strip().splitlines()[-1]
    assert line.startswith("ray job submit --address=http://127.0.0.1:8265 --runtime-env-json=")
    assert '\\"WANDB_MODE\\":\\ \\"offline\\"' in line and "--no-wait" in line
    assert line.endswith(f"-- {TOP_RL} +experiment=gsm8k_qwen3_0.6b steps=3")


def test_submit_stops_on_a_refused_config(tmp_path):
    fake = tmp_path / "top-rl"  # a top-rl whose dry run refuses the config
    fake.write_text("#!/bin/sh\necho 'top-rl: invalid config: rollout.temperature=0.0' >&2\nexit 2\n")
    fake.chmod(0o755)
    out = _sh("submit.sh", "+experiment=gsm8k_qwen3_0.6b", "rollout.temperature=0", TOP_RL=str(fake))
    assert out.returncode == 2 and "rollout.temperature" in out.stderr and "ray job submit" not in out.stdout
    assert _sh("submit.sh").returncode == 2  # overrides are required


def test_check_image(tmp_path):
    """launch/check_image.py (the Docker build's last step) accepts this venv's pins and catches a changed stack."""
    import importlib.metadata as md
    good, bad = tmp_path / "good.txt", tmp_path / "bad.txt"
    good.write_text(f"torch=={md.version('torch')}\n")
    bad.write_text("torch==0.0.1\n")
    env = {**os.environ, "PYTHONPATH": str(LAUNCH.parent)}
    ok = subprocess.run([sys.executable, str(LAUNCH / "check_image.py"), str(good)], capture_output=True, text=True, env=env)
    if "sglang None" in ok.stderr:
        pytest.skip("sglang not installed")
    assert ok.returncode == 0, ok.stderr
    out = subprocess.run([sys.executable, str(LAUNCH / "check_image.py"), str(bad)], capture_output=True, text=True, env=env)
    assert out.returncode == 1 and "the base image had 0.0.1" in out.stderr
