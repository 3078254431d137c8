"""The whole loop through Ray (local ray.init), Megatron-core on gloo and the native engine, on CPU."""

import json
import os
import subprocess
import sys

import pytest

from top_rl.observe.tracking import REQUIRED_KEYS

from tests.startup_lines import assert_started

pytestmark = pytest.mark.slow
SMALL = ["rollout.prompts_per_step=4", "rollout.n_samples=4", "cluster.torch_threads=1"]


ROLLOUT_KEYS = {"perf/rollout_tokens_per_s", "rollout/response_len_mean", "rollout/response_len_max",
                "rollout/response_len_min", "rollout/truncated_frac"}


def _wandb_history_keys(path) -> set[str]:
    """Every key of every history row in an offline wandb run file (read with wandb's own protobufs)."""
    from wandb.proto import wandb_internal_pb2

    from top_rl.observe import wandb_history

    keys = set()
    for raw in wandb_history.records(path):
        rec = wandb_internal_pb2.Record()
        rec.ParseFromString(raw)
        if rec.WhichOneof("record_type") == "history":
            keys |= {it.key or "/".join(it.nested_key) for it in rec.history.item}
    return keys


def _run(tmp_path, *overrides, timeout=300):
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true"}
    out = subprocess.run([sys.executable, "-m", "top_rl.cli", f"run_dir={tmp_path}", *SMALL, *overrides],
                         capture_output=True, text=True, timeout=timeout, env=env)
    rows = []
    if (tmp_path / "metrics.jsonl").exists():
        rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    return out, rows


def test_top_job_gates_every_step(tmp_path):
    out, rows = _run(tmp_path, "steps=3")
    assert out.returncode == 0, out.stderr[-3000:]
    assert [r["step"] for r in rows] == [1, 2, 3]
    for r in rows:
        for key in REQUIRED_KEYS:  # what the docs promise in every row
            assert key in r, key
        assert r["train/train_rollout_logprob_abs_diff"] == 0.0 and r["train/ess_ratio"] == 1.0
        # the rollout metrics every engine reports (issue 23): 4 prompts x 4 samples, max_new_tokens 4
        assert 1 <= r["rollout/response_len_min"] <= r["rollout/response_len_mean"] <= r["rollout/response_len_max"] <= 4
        assert r["rollout/truncated_frac"] in {k / 16 for k in range(17)} and r["perf/rollout_tokens_per_s"] > 0
    assert all(r["kernels/fallbacks"] == 0 for r in rows)  # every op ran the path its KernelPlan names
    for r in rows:  # issue 52's step metrics: the rewards' spread, the groups without signal, the advantages, speed
        assert r["rollout/reward_min"] <= r["rollout/reward_mean"] <= r["rollout/reward_max"]
        assert r["rollout/groups_one_reward_frac"] in {k / 4 for k in range(5)}
        assert r["train/advantage_min"] <= r["train/advantage_mean"] <= r["train/advantage_max"]
        assert r["perf/trained_tokens_per_s"] > 0 and r["train/lr"] == 0.002
        assert r["rollout/entropy_mc"] > 0  # the sampled tokens' mean -log p
    assert 0 < rows[0]["perf/wall_time"] < rows[1]["perf/wall_time"] < rows[2]["perf/wall_time"]
    reports = json.loads((tmp_path / "kernels.json").read_text())  # one per actor: trainer rank, engine
    assert len(reports) == 2 and all(rep["backend"] == "reference" and rep["fallbacks"] == {} for rep in reports)
    assert "step 3 | reward" in out.stdout and " | len " in out.stdout and " tok/s" in out.stdout  # the console line
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert runs, "wandb offline run missing"
    assert ROLLOUT_KEYS <= _wandb_history_keys(next(runs[0].glob("run-*.wandb")))
    assert list((tmp_path / "checkpoints").glob("step_000003")), "final checkpoint missing"
    assert_started(out.stdout, tmp_path)  # issue 53 item 3: the start-up lines and run_dir/logs/<this run>/


def test_rollout_chunking_changes_no_number(tmp_path):
    """Sending the rollout in engine calls of 5 samples gives the same run, number for number: under TOP a
    sample depends only on its prompt, seed and the weights."""
    one, rows_one = _run(tmp_path / "one", "steps=2", "cluster.rollout_chunk=0")
    chunked, rows_chunked = _run(tmp_path / "chunked", "steps=2", "cluster.rollout_chunk=5")
    assert one.returncode == 0 and chunked.returncode == 0, (one.stderr[-2000:], chunked.stderr[-2000:])
    strip = lambda rows: [{k: v for k, v in r.items() if not k.startswith("perf/")} for r in rows]  # noqa: E731
    assert len(rows_one) == 2 and strip(rows_one) == strip(rows_chunked)


def test_baseline_without_top_shows_the_mismatch(tmp_path):
    """top.enabled=false: the stock kernels (plain torch ops on CPU), parity logged but not gated - and on this CPU it is not zero."""
    out, rows = _run(tmp_path, "steps=3", "top.enabled=false")
    assert out.returncode == 0, out.stderr[-3000:]
    assert len(rows) == 3
    assert any(r["train/train_rollout_logprob_abs_diff"] > 0 for r in rows)
