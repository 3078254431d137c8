"""rollout.policy_lag=2 through the whole loop on CPU (Ray, Megatron-core on gloo, the native engine): the TwoAhead
schedule (top_rl.driver.schedule) and a trainer keeping copies of two versions, nothing else new. Every step gated bit
for bit under the version that sampled it, two versions behind the trainer once there are two; a SIGKILLed run resumed
from its checkpoint is bitwise the run that never stopped; dynamic sampling is refused with it before anything
starts."""

from __future__ import annotations

import pytest

from tests import rl_runs
from tests.rl_runs import STEPS

from top_rl.cli import compose
from top_rl.config import ConfigError

LAG2 = "rollout.policy_lag=2"


def test_dynamic_sampling_with_a_lag_of_two_is_refused_naming_both_keys():
    with pytest.raises(ConfigError, match=r"rollout\.policy_lag=2 with algo\.dynamic_sampling\.enabled=true"):
        compose([LAG2, "algo.dynamic_sampling.enabled=true"])
    with pytest.raises(ConfigError, match=r"rollout\.policy_lag=2 with cluster\.gpu_handoff=true"):
        compose(["rollout=sglang", "cluster.gpu_handoff=true", LAG2])


@pytest.mark.slow
def test_every_step_two_versions_behind_is_gated_under_the_version_that_sampled_it():
    rows = rl_runs.rows(rl_runs.straight(LAG2))
    rl_runs.assert_lagged_steps(rows, lags=[0, 1] + [2] * (STEPS - 2), versions=[1, 1] + list(range(1, STEPS - 1)))
    assert any(r["train/grad_norm"] > 0 for r in rows[2:]), "the weights must move, or the lag proves nothing"


@pytest.mark.slow
def test_sigkill_then_resume_is_bitwise_the_straight_run(tmp_path):
    saved, resumed = rl_runs.kill_and_resume(tmp_path, LAG2)
    # the first batch not yet trained at the kill: step 4's, generated under version 2 (step 5's under 3 in flight)
    assert saved["behaviour_version"] == 2
    assert "step 4 |" in resumed.stdout and "lag 2 (v2)" in resumed.stdout
    rl_runs.assert_bitwise_the_straight_run(tmp_path, rl_runs.straight(LAG2))
