"""The loop through Ray with a multi-rank trainer on gloo (CPU): data parallelism (world = dp*tp*pp*cp, the
batch split over DP ranks) with the trainer broadcasting weights to the engine over a gloo group, and a
pipeline-parallel trainer whose loss metrics (computed on its last stage) still reach metrics.jsonl. Every
step keeps abs_diff == 0 and ess == 1. Also: a placement this machine cannot hold is refused before Ray."""

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow
SMALL = ["rollout.prompts_per_step=4", "rollout.n_samples=4", "cluster.torch_threads=1", "steps=2",
         "cluster.num_cpus=4"]
LOSS_KEYS = ("train/loss/pg_loss", "train/loss/pg_clipfrac", "train/loss/ppo_kl", "train/loss/ratio_max",
             "train/grad_norm")


def _run(tmp_path, *overrides, timeout=300):
    env = {**os.environ, "WANDB_MODE": "disabled"}
    out = subprocess.run([sys.executable, "-m", "top_rl.cli", f"run_dir={tmp_path}", *SMALL, *overrides],
                         capture_output=True, text=True, timeout=timeout, env=env)
    path = tmp_path / "metrics.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    return out, rows


def _gated(rows):
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert r["train/train_rollout_logprob_abs_diff"] == 0.0 and r["train/ess_ratio"] == 1.0
        for key in LOSS_KEYS:
            assert key in r, key


def test_dp2_with_the_trainer_broadcasting_weights(tmp_path):
    out, rows = _run(tmp_path, "trainer.dp=2", "cluster.weight_transport=broadcast", "algo.updates_per_rollout=2")
    assert out.returncode == 0, out.stderr[-3000:]
    _gated(rows)
    assert rows[0]["train/micro_batches"] >= 2  # rank 0 ran a micro-batch for each of the two updates


def test_pp2_reports_loss_metrics_from_the_last_stage(tmp_path):
    out, rows = _run(tmp_path, "trainer.pp=2")
    assert out.returncode == 0, out.stderr[-3000:]
    _gated(rows)


def test_unplaceable_layout_is_refused_before_ray(tmp_path):
    out, rows = _run(tmp_path / "run", "cluster.trainer_gpus=1", timeout=60)
    assert out.returncode != 0
    assert "asks for 1 engine(s) x 0 GPU, 1 trainer rank(s) x 1 GPU" in out.stderr
    assert "this machine has" in out.stderr and "0 GPU" in out.stderr
    assert "Started a local Ray" not in out.stdout + out.stderr  # refused before ray.init
    assert not (tmp_path / "run").exists()
