"""DAPO's dynamic sampling and overlong shaping through the whole loop (the default tiny CPU job: Ray, the native
engine, Megatron-core on gloo): extra rounds are drawn, the gate proves every step (abs_diff 0), the data position
moves past every prompt drawn, and a SIGKILL + resume is bitwise the straight run."""

import json

import pytest

from tests import rl_runs
from top_rl.run import checkpoint

pytestmark = pytest.mark.slow
DAPO = ["algo.dynamic_sampling.enabled=true", "algo.dynamic_sampling.max_rounds=2", "algo.overlong.enabled=true",
        "algo.overlong.buffer=1", "cluster.torch_threads=1", "checkpoint.every=1", "checkpoint.keep=3", "steps=3"]


def test_dynamic_sampling_trains_gated_and_resumes_bitwise(tmp_path):
    straight = rl_runs.run(tmp_path / "straight", *DAPO)
    assert straight.returncode == 0, straight.stderr[-3000:]
    ref = rl_runs.rows(tmp_path / "straight")
    assert [r["step"] for r in ref] == [1, 2, 3]
    for r in ref:
        assert r["train/train_rollout_logprob_abs_diff"] == 0.0 and r["train/ess_ratio"] == 1.0
        assert 0 <= r["rollout/dynamic_rounds"] <= 2
        assert r["rollout/dynamic_drawn_groups"] == 16 * (r["rollout/dynamic_rounds"] + 1)
        assert r["rollout/overlong_penalty_mean"] <= 0
    # the tiny model is wrong on most prompts: groups are dropped and rounds drawn to refill the batch
    assert any(r["rollout/dynamic_rounds"] > 0 and r["rollout/dynamic_dropped_groups"] > 0 for r in ref)
    # the data position advanced by every prompt drawn, not by the batch's 16 a step
    state = json.loads((checkpoint.latest(tmp_path / "straight") / "state.json").read_text())
    size = state["config"]["task"]["num_prompts"]
    drawn = sum(r["rollout/dynamic_drawn_groups"] for r in ref)
    assert drawn > 3 * 16 and state["position"]["epoch"] * size + state["position"]["index"] == drawn

    killed = rl_runs.run(tmp_path / "resumed", *DAPO, fault="kill_after_step:2")
    assert killed.returncode == -9, killed.stderr[-3000:]
    resumed = rl_runs.run(tmp_path / "resumed", *DAPO, "resume=true")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert rl_runs.without_timing(rl_runs.rows(tmp_path / "resumed")) == rl_runs.without_timing(ref)
    assert rl_runs.state_hash(checkpoint.latest(tmp_path / "resumed")) == \
        rl_runs.state_hash(checkpoint.latest(tmp_path / "straight"))


def test_bad_dapo_keys_are_refused_in_one_line_before_start(tmp_path):
    out = rl_runs.run(tmp_path, "algo.dynamic_sampling.enabled=true", "algo.dynamic_sampling.max_rounds=300")
    assert out.returncode == 2 and not (tmp_path / "metrics.jsonl").exists()
    assert "algo.dynamic_sampling.max_rounds=300" in out.stderr + out.stdout
    out = rl_runs.run(tmp_path, "algo.overlong.enabled=true", "algo.overlong.buffer=3")  # max_new_tokens is 2
    assert out.returncode == 2 and "algo.overlong.buffer=3 must be in [1, rollout.max_new_tokens=2]" in out.stderr + out.stdout
