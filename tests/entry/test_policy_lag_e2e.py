"""rollout.policy_lag=1 through the whole loop on CPU (Ray, Megatron-core on gloo, the native engine): every step
gated bit for bit under the version that sampled it, one version behind the trainer; a SIGKILLed run resumed is
bitwise the run that never stopped; the GPU handoff is refused with a lag before anything starts."""

from __future__ import annotations

import pytest

from tests import rl_runs
from tests.rl_runs import STEPS

from top_rl.cli import compose
from top_rl.config import ConfigError

LAG = "rollout.policy_lag=1"


def test_gpu_handoff_with_a_lag_is_refused_naming_both_keys():
    with pytest.raises(ConfigError, match=r"rollout\.policy_lag=1 with cluster\.gpu_handoff=true: the server must stay "
                                          r"resident to generate the next batch while the trainer trains"):
        compose(["rollout=sglang", "cluster.gpu_handoff=true", LAG])
    with pytest.raises(ConfigError, match=r"rollout\.policy_lag=3 must be 0 \(synchronous\), 1 .* or 2"):
        compose(["rollout.policy_lag=3"])
    with pytest.raises(ConfigError, match=r"rollout\.policy_lag=1 with algo\.old_logprobs=recompute"):
        compose([LAG, "algo.old_logprobs=recompute"])


def test_the_refusal_is_one_top_rl_line_and_nothing_starts(tmp_path):
    out = rl_runs.run(tmp_path / "run", "rollout=sglang", "cluster.gpu_handoff=true", LAG, timeout=120)
    assert out.returncode != 0
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("top-rl: ") and "rollout.policy_lag=1" in lines[0] \
        and "cluster.gpu_handoff=true" in lines[0], out.stderr[-2000:]
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_every_lagged_step_is_gated_under_the_version_that_sampled_it():
    rows = rl_runs.rows(rl_runs.straight(LAG))
    rl_runs.assert_lagged_steps(rows, lags=[0] + [1] * (STEPS - 1), versions=[1] + list(range(1, STEPS)))
    assert all(r["perf/overlap_s"] >= 0 for r in rows)
    assert "perf/trainer/behaviour_forward_s" not in rows[0]  # step 1 trains on the live version: no extra forward
    assert any(r["train/grad_norm"] > 0 for r in rows[1:]), "the weights must move, or the lag proves nothing"


@pytest.mark.slow
def test_sigkill_then_resume_is_bitwise_the_straight_lagged_run(tmp_path):
    saved, resumed = rl_runs.kill_and_resume(tmp_path, LAG)
    assert saved["behaviour_version"] == 3  # the rollout in flight at the kill: step 4's, under version 3
    assert "step 4 |" in resumed.stdout and "lag 1 (v3)" in resumed.stdout
    rl_runs.assert_bitwise_the_straight_run(tmp_path, rl_runs.straight(LAG))
