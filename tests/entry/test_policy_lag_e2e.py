"""rollout.policy_lag=1 through the whole loop on CPU (Ray, Megatron-core on gloo, the native engine): every step
gated bit for bit under the version that sampled it, one version behind the trainer; a SIGKILLed run resumed is
bitwise the run that never stopped; the GPU handoff is refused with a lag before anything starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import rl_runs
from tests.rl_runs import BASE, STEPS

from top_rl.cli import compose
from top_rl.config import ConfigError
from top_rl.run import checkpoint

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


_lagged: dict[str, Path] = {}


def _straight() -> Path:
    """The uninterrupted 6-step run with a lag (once per session)."""
    if "dir" not in _lagged:
        import tempfile

        d = Path(tempfile.mkdtemp(prefix="top_rl_lag1_"))
        out = rl_runs.run(d, *BASE, LAG, f"steps={STEPS}")
        assert out.returncode == 0, out.stderr[-4000:]
        _lagged["dir"] = d
    return _lagged["dir"]


@pytest.mark.slow
def test_every_lagged_step_is_gated_under_the_version_that_sampled_it():
    rows = rl_runs.rows(_straight())
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    for r in rows:
        assert r["train/train_rollout_logprob_abs_diff"] == 0.0 and r["train/ess_ratio"] == 1.0, r
        assert r["perf/overlap_s"] >= 0
    assert [r["train/policy_lag"] for r in rows] == [0] + [1] * (STEPS - 1)
    assert [r["train/behaviour_version"] for r in rows] == [1] + list(range(1, STEPS))
    assert all(r["perf/trainer/behaviour_forward_s"] > 0 for r in rows[1:])  # the extra forward of a lagged batch
    assert "perf/trainer/behaviour_forward_s" not in rows[0]  # step 1 trains on the live version: no extra forward
    assert any(r["train/grad_norm"] > 0 for r in rows[1:]), "the weights must move, or the lag proves nothing"
    # another algorithm than the synchronous loop: from step 2 on its batches come from older weights
    sync = rl_runs.rows(rl_runs.baseline())
    strip = rl_runs.without_timing
    assert strip(rows)[0] == {k: v for k, v in strip(sync)[0].items()} | {"train/policy_lag": 0,
                                                                         "train/behaviour_version": 1}
    assert [r["rollout/reward_mean"] for r in rows[2:]] != [r["rollout/reward_mean"] for r in sync[2:]]


@pytest.mark.slow
def test_sigkill_then_resume_is_bitwise_the_straight_lagged_run(tmp_path):
    straight = _straight()
    ref = rl_runs.rows(straight)
    proc = rl_runs.start(tmp_path, *BASE, LAG, f"steps={STEPS}", fault="kill_after_step:3")
    killed = rl_runs.finish(proc)
    assert killed.returncode == -9, killed.stderr[-3000:]
    assert [r["step"] for r in rl_runs.rows(tmp_path)] == [1, 2, 3]
    ckpt = checkpoint.latest(tmp_path)
    assert checkpoint.step_of(ckpt) == 3
    saved = checkpoint.load_verified(ckpt)
    assert saved["behaviour_version"] == 3  # the rollout in flight at the kill: step 4's, under version 3
    resumed = rl_runs.run(tmp_path, *BASE, LAG, f"steps={STEPS}", "resume=true")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "step 4 |" in resumed.stdout and "lag 1 (v3)" in resumed.stdout
    got = rl_runs.rows(tmp_path)
    assert [r["step"] for r in got] == list(range(1, STEPS + 1))
    assert rl_runs.without_timing(got) == rl_runs.without_timing(ref)
    assert rl_runs.state_hash(rl_runs.final_checkpoint(tmp_path)) == \
        rl_runs.state_hash(rl_runs.final_checkpoint(straight))
