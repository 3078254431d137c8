"""Cluster-ready run directories (issue 53 item 4): run_dir is made absolute on the driver, and a run whose run_dir
some trainer rank's node does not see is refused before any rank builds its model, naming the rank and its node.
The node that does not mount run_dir is stood in for by the test-only fault run_dir_unseen:N (trainer rank N-1 reads
an empty directory of its own in place of run_dir: the real read, on a path with nothing there), through a real
local Ray run; two Ray nodes on one machine would need a second raylet on 2 shared cores."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from top_rl.driver import shared_run_dir


def test_token_round_trip_and_the_refusal_names_rank_and_node(tmp_path):
    token = shared_run_dir.write_token(tmp_path)
    assert shared_run_dir.read_token(tmp_path, token) is None
    assert "holds another token" in shared_run_dir.read_token(tmp_path, "0" * 32)
    other = tmp_path / "elsewhere"
    other.mkdir()
    assert shared_run_dir.read_token(other, token).endswith("does not exist there")
    assert shared_run_dir.read_token(tmp_path / "missing", token) == f"{tmp_path / 'missing'} does not exist there"
    shared_run_dir.remove_token(tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ["elsewhere"]  # the token is gone
    assert shared_run_dir.refusal("/shared/run", [(0, "10.0.0.1", None), (1, "10.0.0.2", None)]) is None
    why = shared_run_dir.refusal("/shared/run", [(0, "10.0.0.1", None), (1, "10.0.0.2", "/shared/run does not exist there")])
    assert why.startswith("run_dir=/shared/run is not the same directory on every node with a trainer rank "
                          "(trainer rank 1 on node 10.0.0.2: /shared/run does not exist there)")
    assert "docs/cluster.md" in why and "10.0.0.1" not in why


@pytest.mark.slow
def test_a_run_dir_one_rank_cannot_see_is_refused_before_the_ranks_start(tmp_path):
    env = {**os.environ, "WANDB_MODE": "disabled", "WANDB_SILENT": "true", "TOP_RL_FAULT": "run_dir_unseen:2"}
    out = subprocess.run([sys.executable, "-m", "top_rl.cli", "run_dir=rel/run", "steps=1", "trainer.dp=2",
                          "rollout.prompts_per_step=4", "rollout.n_samples=4", "cluster.torch_threads=1", "cluster.num_cpus=3"],
                         capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    run_dir = tmp_path / "rel" / "run"  # relative on the command line, absolute in every message after the checks
    assert out.returncode != 0
    assert f"[top-rl] start-up" in out.stdout and "trainer rank 0 ready" not in out.stdout  # no model was built
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith(f"top-rl: run_dir={run_dir} is not the same directory on every node with a trainer rank "
                           "(trainer rank 1 on node 127.0.0.1: "), out.stderr[-3000:]
    assert "trainer rank 0 on" not in last and "Traceback" not in out.stderr
    assert not (run_dir / shared_run_dir.TOKEN_FILE).exists() and not (run_dir / "metrics.jsonl").exists()
    assert not list(run_dir.glob("checkpoints/step_*"))
