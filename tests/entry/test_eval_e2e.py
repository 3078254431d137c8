"""eval.every through the whole loop (Ray, the native engine, Megatron-core on gloo, CPU): eval/* in every K-th row,
the training numbers those of the run without eval, and a SIGKILL + resume evaluates at the same steps with the same
numbers, each step's row once."""

import pytest

from tests import rl_runs
from tests.rl_runs import BASE

pytestmark = pytest.mark.slow
EVAL = ["eval.every=2", "eval.n_samples=4", "eval.max_prompts=5", "steps=4"]


def test_eval_rows_leave_training_alone_and_resume_bitwise(tmp_path):
    plain = rl_runs.run(tmp_path / "plain", *BASE, "steps=4")
    straight = rl_runs.run(tmp_path / "straight", *BASE, *EVAL)
    assert plain.returncode == 0 and straight.returncode == 0, (plain.stderr[-2000:], straight.stderr[-2000:])
    ref = rl_runs.rows(tmp_path / "straight")
    assert [r["step"] for r in ref] == [1, 2, 3, 4]
    assert [("eval/accuracy" in r) for r in ref] == [False, True, False, True]
    for r in ref[1::2]:
        assert r["eval/prompts"] == 5 and 0 <= r["eval/pass@1"] <= r["eval/pass@2"] <= r["eval/pass@4"] <= 1
        assert r["eval/pass@1"] == pytest.approx(r["eval/accuracy"])  # rewards are 0 or 1 in this task
        assert 1 <= r["eval/response_len_mean"] <= 3 and r["perf/eval_time"] > 0
    # the eval draws nothing from the training stream or RNG: every training number is the plain run's
    no_eval = [{k: v for k, v in r.items() if not k.startswith("eval/")} for r in rl_runs.without_timing(ref)]
    assert no_eval == rl_runs.without_timing(rl_runs.rows(tmp_path / "plain"))

    killed = rl_runs.run(tmp_path / "resumed", *BASE, *EVAL, fault="kill_after_step:3")
    assert killed.returncode == -9, killed.stderr[-3000:]
    resumed = rl_runs.run(tmp_path / "resumed", *BASE, *EVAL, "resume=true")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert rl_runs.without_timing(rl_runs.rows(tmp_path / "resumed")) == rl_runs.without_timing(ref)


def test_a_bad_eval_split_is_refused_before_start(tmp_path):
    out = rl_runs.run(tmp_path, "eval.every=1", "eval.split=test")
    assert out.returncode != 0 and not (tmp_path / "metrics.jsonl").exists()
    assert "eval.split='test': task 'arith' has no task.split" in out.stdout + out.stderr
