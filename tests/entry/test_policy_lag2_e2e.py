"""rollout.policy_lag=2 through the whole loop on CPU (Ray, Megatron-core on gloo, the native engine): the TwoAhead
schedule (top_rl.driver.schedule) and a trainer keeping copies of two versions, nothing else new. Every step gated bit
for bit under the version that sampled it, two versions behind the trainer once there are two; a SIGKILLed run resumed
from its checkpoint is bitwise the run that never stopped; dynamic sampling is refused with it before anything
starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import rl_runs
from tests.rl_runs import BASE, STEPS

from top_rl.cli import compose
from top_rl.config import ConfigError
from top_rl.run import checkpoint

LAG2 = "rollout.policy_lag=2"


def test_dynamic_sampling_with_a_lag_of_two_is_refused_naming_both_keys():
    with pytest.raises(ConfigError, match=r"rollout\.policy_lag=2 with algo\.dynamic_sampling\.enabled=true"):
        compose([LAG2, "algo.dynamic_sampling.enabled=true"])
    with pytest.raises(ConfigError, match=r"rollout\.policy_lag=2 with cluster\.gpu_handoff=true"):
        compose(["rollout=sglang", "cluster.gpu_handoff=true", LAG2])


_lagged: dict[str, Path] = {}


def _straight() -> Path:
    """The uninterrupted 6-step run with a lag of two (once per session)."""
    if "dir" not in _lagged:
        import tempfile

        d = Path(tempfile.mkdtemp(prefix="top_rl_lag2_"))
        out = rl_runs.run(d, *BASE, LAG2, f"steps={STEPS}")
        assert out.returncode == 0, out.stderr[-4000:]
        _lagged["dir"] = d
    return _lagged["dir"]


@pytest.mark.slow
def test_every_step_two_versions_behind_is_gated_under_the_version_that_sampled_it():
    rows = rl_runs.rows(_straight())
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    for r in rows:
        assert r["train/train_rollout_logprob_abs_diff"] == 0.0 and r["train/ess_ratio"] == 1.0, r
    assert [r["train/policy_lag"] for r in rows] == [0, 1] + [2] * (STEPS - 2)
    assert [r["train/behaviour_version"] for r in rows] == [1, 1] + list(range(1, STEPS - 1))
    assert all(r["perf/trainer/behaviour_forward_s"] > 0 for r in rows[1:])  # the snapshot forward of a lagged batch
    assert any(r["train/grad_norm"] > 0 for r in rows[2:]), "the weights must move, or the lag proves nothing"
    # the first batch is the synchronous run's (version 1 either way); from step 3 on they come from older weights
    sync = rl_runs.rows(rl_runs.baseline())
    assert rl_runs.without_timing(rows)[0] == rl_runs.without_timing(sync)[0] | {"train/policy_lag": 0,
                                                                                  "train/behaviour_version": 1}
    assert [r["rollout/reward_mean"] for r in rows[2:]] != [r["rollout/reward_mean"] for r in sync[2:]]


@pytest.mark.slow
def test_sigkill_then_resume_is_bitwise_the_straight_run(tmp_path):
    straight = _straight()
    ref = rl_runs.rows(straight)
    proc = rl_runs.start(tmp_path, *BASE, LAG2, f"steps={STEPS}", fault="kill_after_step:3")
    killed = rl_runs.finish(proc)
    assert killed.returncode == -9, killed.stderr[-3000:]
    assert [r["step"] for r in rl_runs.rows(tmp_path)] == [1, 2, 3]
    ckpt = checkpoint.latest(tmp_path)
    assert checkpoint.step_of(ckpt) == 3
    # the first batch not yet trained at the kill: step 4's, generated under version 2 (step 5's under 3 in flight)
    assert checkpoint.load_verified(ckpt)["behaviour_version"] == 2
    resumed = rl_runs.run(tmp_path, *BASE, LAG2, f"steps={STEPS}", "resume=true")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "step 4 |" in resumed.stdout and "lag 2 (v2)" in resumed.stdout
    got = rl_runs.rows(tmp_path)
    assert [r["step"] for r in got] == list(range(1, STEPS + 1))
    assert rl_runs.without_timing(got) == rl_runs.without_timing(ref)
    assert rl_runs.state_hash(rl_runs.final_checkpoint(tmp_path)) == \
        rl_runs.state_hash(rl_runs.final_checkpoint(straight))
