"""trainer.lr_schedule / lr_warmup_steps / lr_min / lr_decay_steps (top_rl/rl/lr_schedule.py): the curve, the keys'
refusals, and a run that follows it, logs it as train/lr and resumes bitwise."""

import json
import math
import shutil

import pytest

from top_rl.config import ConfigError
from top_rl.rl.lr_schedule import LrSchedule
from top_rl.run import checkpoint

from tests import rl_runs


def test_warmup_then_linear_and_cosine_decay_to_the_floor():
    lin = LrSchedule(1.0, "linear", warmup_steps=2, lr_min=0.1, decay_steps=6)
    assert [lin.lr_at(k) for k in range(8)] == pytest.approx([0.5, 1.0, 1.0, 0.775, 0.55, 0.325, 0.1, 0.1])
    cos = LrSchedule(1.0, "cosine", warmup_steps=0, lr_min=0.0, decay_steps=4)
    assert [cos.lr_at(k) for k in range(6)] == pytest.approx([1.0, 0.5 * (1 + math.cos(math.pi / 4)), 0.5,
                                                              0.5 * (1 + math.cos(3 * math.pi / 4)), 0.0, 0.0])
    warm = LrSchedule(0.002, "constant", warmup_steps=4)
    assert [warm.lr_at(k) for k in range(6)] == pytest.approx([0.0005, 0.001, 0.0015, 0.002, 0.002, 0.002])
    assert not warm.is_constant and LrSchedule(0.002).is_constant
    assert all(LrSchedule(0.002).lr_at(k) == 0.002 for k in range(100))  # exactly trainer.lr: the default's bits


@pytest.mark.parametrize("overrides,message", [
    (["trainer.lr_schedule=step"], r"trainer.lr_schedule='step'; choose one of: constant, linear, cosine"),
    (["trainer.lr_warmup_steps=-1"], r"trainer.lr_warmup_steps=-1 must be >= 0"),
    (["trainer.lr_min=0.5"], r"trainer.lr_min=0.5 must be in \[0, trainer.lr=0.002\]"),
    (["trainer.lr_schedule=cosine", "trainer.lr_warmup_steps=5", "trainer.lr_decay_steps=5"],
     r"trainer.lr_decay_steps=5 must exceed trainer.lr_warmup_steps=5"),
])
def test_bad_schedule_keys_are_refused_naming_them(overrides, message):
    from top_rl.cli import compose

    with pytest.raises(ConfigError, match=message):
        compose(overrides)


def test_a_resume_that_moves_the_decay_horizon_is_refused():
    from top_rl.cli import compose

    saved = compose(["trainer.lr_schedule=cosine", "steps=10"]).as_dict()
    now = compose(["trainer.lr_schedule=cosine", "steps=20"]).as_dict()
    with pytest.raises(checkpoint.ResumeRefused, match=r"steps: checkpoint 10 -> now 20 .*trainer.lr_decay_steps=10"):
        checkpoint.check_compatible(saved, now, allow_changes=False)
    fixed = compose(["trainer.lr_schedule=cosine", "steps=20", "trainer.lr_decay_steps=10"]).as_dict()
    assert checkpoint.check_compatible(compose(["trainer.lr_schedule=cosine", "steps=10",
                                                "trainer.lr_decay_steps=10"]).as_dict(), fixed, False) == []
    constant = compose(["steps=20"]).as_dict()  # a constant lr: steps stays free
    assert checkpoint.check_compatible(compose(["steps=10"]).as_dict(), constant, False) == []


SCHEDULE = ["trainer.lr_schedule=cosine", "trainer.lr_warmup_steps=2", "trainer.lr_min=0.001"]


@pytest.mark.slow
def test_a_run_follows_the_schedule_and_resumes_bitwise(tmp_path):
    straight = tmp_path / "straight"
    out = rl_runs.run(straight, *rl_runs.BASE, *SCHEDULE, "steps=5")
    assert out.returncode == 0, out.stderr[-3000:]
    rows = rl_runs.rows(straight)
    want = LrSchedule(0.01, "cosine", 2, 0.001, 5)
    assert [r["train/lr"] for r in rows] == [want.lr_at(k) for k in range(5)]  # one update per step
    assert len({r["train/lr"] for r in rows}) == 5
    ckpt = straight / "checkpoints" / "step_000004"
    # the schedule's position is the trainer's update count, which the checkpoint holds (the lr itself is recomputed)
    assert json.loads((ckpt / "trainer" / "trainer_state.json").read_text())["step"] == 4

    resumed = tmp_path / "resumed"
    shutil.copytree(straight, resumed)
    for late in ("step_000004", "step_000005"):
        shutil.rmtree(resumed / "checkpoints" / late)
    (resumed / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:3]))
    out = rl_runs.run(resumed, *rl_runs.BASE, *SCHEDULE, "steps=5", "resume=true")
    assert out.returncode == 0, out.stderr[-3000:]
    assert rl_runs.without_timing(rl_runs.rows(resumed)) == rl_runs.without_timing(rows)
    assert rl_runs.state_hash(resumed / "checkpoints" / "step_000005") == \
        rl_runs.state_hash(straight / "checkpoints" / "step_000005")
