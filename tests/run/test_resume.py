"""Issue 5: a resumed run is bitwise the run that never stopped; checkpoints are atomic and pruned; a
resume with a changed determinism-relevant setting is refused, naming the keys."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from tests import rl_runs
from tests.rl_runs import BASE, STEPS

from top_rl.run import checkpoint
from top_rl.observe import wandb_history
from top_rl.run.checkpoint import ResumeRefused
from top_rl.tasks import ArithConfig, ArithTask, DataPosition


@pytest.fixture
def parent_with_a_wandb_service(monkeypatch, tmp_path):
    """This process holds a wandb service, as any parent that used wandb does (a notebook, a sweep agent, a pytest
    session after an in-process wandb test): wandb offers it to child processes through WANDB_SERVICE. A driver that
    joined it left its SIGKILLed run "in use" there and the resume failed (the CI failure this fixture reproduces)."""
    import wandb

    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb_config"))
    wandb.setup()
    assert os.environ.get("WANDB_SERVICE"), "wandb.setup() no longer offers its service to children: recheck"
    yield
    wandb.teardown()


@pytest.mark.slow
def test_sigkill_after_step_3_then_resume_is_bitwise_the_straight_run(tmp_path, parent_with_a_wandb_service):
    straight = rl_runs.baseline()
    ref = rl_runs.rows(straight)
    assert [r["step"] for r in ref] == list(range(1, STEPS + 1))
    assert any(r["train/grad_norm"] > 0 for r in ref[:3]) and any(r["train/grad_norm"] > 0 for r in ref[3:]), \
        "the weights must move before and after the kill, or the comparison proves nothing"

    proc = rl_runs.start(tmp_path, *BASE, f"steps={STEPS}", fault="kill_after_step:3", wandb="offline")
    killed, killed_pid = rl_runs.finish(proc), proc.pid
    assert killed.returncode == -9, killed.stderr[-3000:]
    assert [r["step"] for r in rl_runs.rows(tmp_path)] == [1, 2, 3]
    assert checkpoint.step_of(checkpoint.latest(tmp_path)) == 3
    saved = json.loads((checkpoint.latest(tmp_path) / "state.json").read_text())
    # 6 steps of 4 prompts over a 6-prompt dataset: the step-3 checkpoint sits exactly at the end of epoch 1
    # (step 2 straddled epochs 0 and 1; step 5 straddles 2 and 3)
    assert saved["position"] == {"epoch": 1, "index": 6}
    run_id = saved["run_id"]

    resumed = rl_runs.run(tmp_path, *BASE, f"steps={STEPS}", "resume=true", wandb="offline")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming from" in resumed.stdout and "step 4 |" in resumed.stdout and "step 3 |" not in resumed.stdout
    got = rl_runs.rows(tmp_path)
    assert [r["step"] for r in got] == list(range(1, STEPS + 1))  # appended, no step twice
    assert rl_runs.without_timing(got) == rl_runs.without_timing(ref)
    assert rl_runs.state_hash(rl_runs.final_checkpoint(tmp_path)) == \
        rl_runs.state_hash(rl_runs.final_checkpoint(straight))
    # wandb continued the same run (offline: two run directories with one id) and, read back with wandb's own
    # protobufs, holds every step exactly once: what the killed attempt lost came back from metrics.jsonl
    files = wandb_history.offline_files(tmp_path, run_id)
    assert run_id and len(files) == 2
    assert sorted(s for f in files for s in wandb_history.history_steps(f)) == list(range(1, STEPS + 1))
    # the SIGKILLed driver left its run_dir lock behind: the resume took it over and said whose it was
    assert f"taking over {tmp_path / 'run.lock'}: it was left by pid {killed_pid} on host" in resumed.stdout
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == \
        ["step_000004", "step_000005", "step_000006"]  # checkpoint.keep=3


@pytest.mark.slow
def test_resume_after_a_torn_row_of_the_checkpoints_step_loses_no_step(tmp_path):
    """Issue 30: 60 bytes cut off step 6's line of metrics.jsonl (checkpoint at 6), then `resume=true steps=8`: the
    file held steps 1..5, 7, 8 and nothing was said. Step 6's row comes back exactly from the checkpoint's copy,
    named in one line, and 7 and 8 follow: every step once."""
    run_dir = tmp_path / "run"
    shutil.copytree(rl_runs.baseline(), run_dir)
    path = run_dir / "metrics.jsonl"
    whole = path.read_text().splitlines()
    path.write_bytes(path.read_bytes()[:-60])
    out = rl_runs.run(run_dir, *BASE, "steps=8", "resume=true")
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr[-3000:]
    lines = path.read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == list(range(1, 9))
    assert lines[:STEPS] == whole  # step 6's row byte for byte (its timings too): the one the run logged
    said = [line for line in out.stderr.splitlines() if line.startswith("top-rl")]
    assert said == [f"top-rl: {path}: step 6 rewritten from checkpoint step_000006's copy (line 6 not a whole row)"]


def test_changed_setting_is_refused_naming_the_key_and_nothing_changes(tmp_path):
    """Refused before anything starts (in-process here; the CLI prints the same message, see test_bad_input)."""
    from top_rl import cli
    from top_rl.cli import compose

    run_dir = tmp_path / "run"
    shutil.copytree(rl_runs.baseline(), run_dir)
    before = rl_runs.tree_hash(run_dir)
    with pytest.raises(ResumeRefused) as refused:
        cli.run(compose([f"run_dir={run_dir}", *BASE, "steps=8", "resume=true", "rollout.temperature=0.7",
                          "algo.loss.clip_eps_low=0.1"]))
    msg = str(refused.value)
    assert "resume refused" in msg and "rollout.temperature: checkpoint 1.0 -> now 0.7" in msg
    assert "algo.loss.clip_eps_low: checkpoint " in msg and "resume_allow_changes=true" in msg
    # a fresh run in a run_dir with checkpoints would overwrite them: refused too
    with pytest.raises(ResumeRefused, match=r"already holds checkpoints \(latest: step_000006\).*resume=true"):
        cli.run(compose([f"run_dir={run_dir}", *BASE, "steps=8"]))
    assert rl_runs.tree_hash(run_dir) == before


def test_resume_without_a_complete_checkpoint_is_refused_and_changes_nothing(tmp_path):
    """Issue 24: resume=true with every state.json gone printed "starting at step 0", replaced metrics.jsonl and
    exited 0. Now: one line, exit 1, nothing written (a run_dir that does not exist is not created)."""
    run_dir = tmp_path / "run"
    ckpt = run_dir / "checkpoints" / "step_000003"  # its state.json removed: not a complete checkpoint
    ckpt.mkdir(parents=True)
    (ckpt / "driver.pt").write_bytes(b"rng")
    (run_dir / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2}\n{"step": 3}\n')
    (run_dir / "wandb" / "offline-run-x").mkdir(parents=True)
    (run_dir / "wandb" / "offline-run-x" / "run-x.wandb").write_bytes(b"history")
    before = rl_runs.tree_hash(run_dir)
    for where in (run_dir, tmp_path / "never_ran"):
        out = rl_runs.run(where, *BASE, f"steps={STEPS}", "resume=true", wandb="offline", timeout=120)
        assert out.returncode == 1, out.stderr[-3000:]
        said = [line for line in out.stderr.splitlines() if line.startswith("top-rl")]
        assert said == [f"top-rl: resume refused: {where} has no complete checkpoint to resume from (looked in "
                        f"{where / 'checkpoints'}); nothing was changed. Drop resume=true to start a new run there"], \
            out.stderr[-3000:]
        assert "Traceback" not in out.stderr and "starting at step 0" not in out.stdout
    assert rl_runs.tree_hash(run_dir) == before
    assert not (tmp_path / "never_ran").exists()


def test_a_fresh_run_never_replaces_the_rows_of_an_earlier_run_that_wrote_no_checkpoint(tmp_path):
    """Issue 54 item 2: after a run with checkpoint.enabled=false, a fresh run on the same run_dir printed only
    "fresh run: replacing .../metrics.jsonl" and the earlier rows were gone. Now it is refused in one line naming
    the rows, the way out (another run_dir, or the file moved aside), and nothing in run_dir changes."""
    run_dir = tmp_path / "run"
    out = rl_runs.run(run_dir, *BASE, "steps=2", "checkpoint.enabled=false")
    assert out.returncode == 0, out.stderr[-3000:]
    assert [r["step"] for r in rl_runs.rows(run_dir)] == [1, 2] and not (run_dir / "checkpoints").exists()
    before = rl_runs.tree_hash(run_dir)
    out = rl_runs.run(run_dir, *BASE, "steps=2", timeout=120)
    assert out.returncode == 1, out.stderr[-3000:]
    assert [line for line in out.stderr.splitlines() if line.startswith("top-rl")] == [
        f"top-rl: {run_dir / 'metrics.jsonl'} holds 2 rows (steps 1-2) of an earlier run that wrote no checkpoint; a "
        "fresh run there would replace them, and resume=true has no checkpoint to continue from. Start elsewhere with "
        "run_dir=<new dir>, or move that metrics.jsonl aside to start again here."], out.stderr[-3000:]
    assert "Traceback" not in out.stderr and rl_runs.tree_hash(run_dir) == before


def test_check_compatible_lists_keys_and_allow_changes_overrides():
    saved = {"steps": 6, "seed": 0, "rollout": {"temperature": 1.0, "n_samples": 4}, "checkpoint": {"every": 1},
             "resume_allow_changes": False}
    now = {"steps": 9, "seed": 1, "rollout": {"temperature": 1.0, "n_samples": 8}, "checkpoint": {"every": 3},
           "resume_allow_changes": True}
    with pytest.raises(ResumeRefused, match=r"(?s)rollout\.n_samples: checkpoint 4 -> now 8.*seed: checkpoint 0"):
        checkpoint.check_compatible(saved, now, allow_changes=False)
    assert checkpoint.check_compatible(saved, now, allow_changes=True) == [
        "rollout.n_samples: checkpoint 4 -> now 8", "seed: checkpoint 0 -> now 1"]


def test_an_sglang_engine_may_move_on_resume_but_not_change_what_it_computes():
    """Where a server runs and how it takes its weights (port, interpreter, timeouts, weight_sync) may change on a
    resume (another node, another install); what it computes with (e.g. its KV pool) is a change like any other."""
    saved = {"rollout": {"sglang": {"port": 30000, "python": "/a/bin/python", "weight_sync": "disk",
                                    "mem_fraction_static": 0.7}}}
    moved = {"rollout": {"sglang": {"port": 31000, "python": "/b/bin/python", "weight_sync": "distributed",
                                    "mem_fraction_static": 0.7}}}
    assert checkpoint.check_compatible(saved, moved, allow_changes=False) == []
    with pytest.raises(ResumeRefused, match=r"rollout\.sglang\.mem_fraction_static: checkpoint 0\.7 -> now 0\.45"):
        checkpoint.check_compatible(saved, {"rollout": {"sglang": {**moved["rollout"]["sglang"],
                                                                   "mem_fraction_static": 0.45}}}, allow_changes=False)


def test_a_setting_newer_than_the_checkpoint_is_a_notice_not_a_change(capsys):
    """A key the checkpoint's config lacks (added to top-rl since, e.g. task.max_row_bytes) keeps the old behaviour by
    default: the resume goes on, naming it; a key the checkpoint has and the run changed is still refused."""
    saved = {"task": {"name": "gsm8k", "path": "d.jsonl"}, "seed": 0}
    now = {"task": {"name": "gsm8k", "path": "d.jsonl", "max_row_bytes": 1048576}, "seed": 0}
    assert checkpoint.check_compatible(saved, now, allow_changes=False) == []
    assert "predates these settings; resuming with their values: task.max_row_bytes=1048576" in capsys.readouterr().out
    with pytest.raises(ResumeRefused, match=r"task\.path: checkpoint 'd.jsonl' -> now 'e.jsonl'"):
        checkpoint.check_compatible(saved, {"task": {**now["task"], "path": "e.jsonl"}, "seed": 0}, allow_changes=False)


def test_allowed_changes_are_applied_or_refused_never_ignored():
    """Issue 24: under resume_allow_changes=true a key whose value the checkpoint supplies (the model, the trainer's
    RNG seed) would be logged as changed and silently ignored: refused, naming it. Optimizer settings are applied."""
    saved = {"model": {"hidden_size": 64, "init_seed": 0}, "trainer": {"lr": 0.01, "seed": 0}, "seed": 0}
    with pytest.raises(ResumeRefused, match=r"(?s)cannot take effect.*model\.hidden_size: checkpoint 64 -> now 128 "
                                            r"\(the policy's weights and architecture are the checkpoint's\)"):
        checkpoint.check_compatible(saved, {**saved, "model": {"hidden_size": 128, "init_seed": 0}}, allow_changes=True)
    with pytest.raises(ResumeRefused, match=r"trainer\.seed: checkpoint 0 -> now 3 \(the trainer's RNG state"):
        checkpoint.check_compatible(saved, {**saved, "trainer": {"lr": 0.01, "seed": 3}}, allow_changes=True)
    assert checkpoint.check_compatible(saved, {**saved, "trainer": {"lr": 0.05, "seed": 0}, "seed": 1},
                                       allow_changes=True) == ["seed: checkpoint 0 -> now 1",
                                                               "trainer.lr: checkpoint 0.01 -> now 0.05"]


@pytest.mark.slow
def test_resume_with_a_new_lr_trains_at_that_lr(tmp_path):
    """Issue 24: `resume_allow_changes=true trainer.lr=0.05` logged train/lr=0.05 and trained at the checkpoint's
    lr. The resumed steps train at the new lr (the lr is this run's config's, put into the loaded optimizer: a
    checkpoint keeps the moments, not the hyperparameters), and its weights differ from the run's."""
    run_dir = tmp_path / "run"
    shutil.copytree(rl_runs.baseline(), run_dir)
    for late in ("step_000005", "step_000006"):
        shutil.rmtree(run_dir / "checkpoints" / late)
    out = rl_runs.run(run_dir, *BASE, "steps=5", "resume=true", "resume_allow_changes=true", "trainer.lr=0.05")
    assert out.returncode == 0, out.stderr[-3000:]
    assert "trainer.lr: checkpoint 0.01 -> now 0.05" in out.stdout
    assert rl_runs.rows(run_dir)[-1]["train/lr"] == 0.05
    ckpt = run_dir / "checkpoints" / "step_000005"
    straight = rl_runs.baseline() / "checkpoints" / "step_000005"
    assert (ckpt / "hf" / "model.safetensors").read_bytes() != (straight / "hf" / "model.safetensors").read_bytes()


def test_resume_positions_cross_epoch_boundaries_like_the_uninterrupted_stream():
    task = ArithTask(ArithConfig(num_prompts=6))
    straight, pos = [], DataPosition()
    for _ in range(6):
        items, pos = task.batch(4, 0, pos)
        straight.append([it.uid for it in items])
    for k in range(1, 6):  # stop after k steps, restore the saved position, continue
        pos = DataPosition()
        for _ in range(k):
            _, pos = task.batch(4, 0, pos)
        pos = DataPosition.from_state_dict(json.loads(json.dumps(pos.state_dict())))
        resumed = []
        for _ in range(6 - k):
            items, pos = task.batch(4, 0, pos)
            resumed.append([it.uid for it in items])
        assert resumed == straight[k:]


def test_partial_and_leftover_directories_never_count(tmp_path, monkeypatch):
    root = tmp_path / "checkpoints"
    for name in ("step_000002", "step_000003.tmp", "step_000004"):
        (root / name).mkdir(parents=True)
        (root / name / "state.json").write_text("{}")
    (root / "step_000005").mkdir()  # no state.json: a shard set without its completion marker
    assert [p.name for p in checkpoint.complete_checkpoints(tmp_path)] == ["step_000002", "step_000004"]
    assert checkpoint.step_of(checkpoint.latest(tmp_path)) == 4


def test_keep_must_be_positive_in_the_config():  # the one check of checkpoint.keep
    from top_rl.cli import compose
    from top_rl.config import ConfigError

    with pytest.raises(ConfigError, match="checkpoint.keep=0 must be >= 1"):
        compose(["checkpoint.keep=0"])
    with pytest.raises(ConfigError, match="checkpoint.every=-1 must be >= 0"):
        compose(["checkpoint.every=-1"])


def test_a_layout_change_is_refused_without_allow_changes_and_noted_with_it(tmp_path, capsys):
    """Issue 53: trainer.dp/tp are config changes like any other that move the numbers: refused by name, allowed with
    resume_allow_changes=true, and then the resume says the steps that follow are not bitwise the uninterrupted run's."""
    from top_rl.cli import compose

    run_dir = tmp_path / "run"
    shutil.copytree(rl_runs.baseline(), run_dir)
    args = [f"run_dir={run_dir}", *BASE, f"steps={STEPS}", "resume=true", "trainer.dp=2"]
    with pytest.raises(ResumeRefused, match=r"trainer\.dp: checkpoint 1 -> now 2"):
        checkpoint.prepare(run_dir, compose(args))
    state = checkpoint.prepare(run_dir, compose([*args, "resume_allow_changes=true"]))
    out = capsys.readouterr().out
    assert "the trainer layout changes from {'dp': 1, 'tp': 1, 'pp': 1, 'cp': 1} to {'dp': 2, 'tp': 1, 'pp': 1, " \
           "'cp': 1}" in out and "not bitwise the uninterrupted run's" in out
    assert state["trainer"] == [str((checkpoint.latest(run_dir) / "trainer").resolve())] * 2


def test_a_checkpoint_before_format_3_resumes_on_its_layout_only(tmp_path):
    """Per-rank trainer_rankNNN.pt shards (top-rl before DCP): verified and handed to their ranks on the layout they
    were written with; another layout is refused in one line naming the conversion (tests/run/test_convert_checkpoint.py)."""
    from top_rl.run import trainer_files

    ckpt = rl_runs.fake_run(tmp_path)  # format 2: trainer_rank000.pt
    state = checkpoint.load_verified(ckpt, driver=False)
    one = {"dp": 1, "tp": 1, "pp": 1, "cp": 1}
    assert trainer_files.paths(ckpt, state, one, one) == [str((ckpt / "trainer_rank000.pt").resolve())]
    with pytest.raises(ResumeRefused) as refused:
        trainer_files.paths(ckpt, state, one, {**one, "dp": 2})
    assert len(str(refused.value).splitlines()) == 1
    assert "trainer_rankNNN.pt, written by top-rl before checkpoint format 3" in str(refused.value)
    assert f"convert them once with `top-rl-convert-checkpoint run_dir={tmp_path.resolve()}` (then any layout loads " \
           "them), or resume with that layout" in str(refused.value)


@pytest.mark.slow
def test_a_resume_with_two_dp_ranks_continues_a_one_rank_run(tmp_path):
    """Issue 53 acceptance (CPU, gloo): the one-rank run's step-5 checkpoint resumes with trainer.dp=2; the step
    trains, and the state it loaded was the checkpoint's (its own step-6 checkpoint holds what it trained from)."""
    run_dir = tmp_path / "run"
    shutil.copytree(rl_runs.baseline(), run_dir)
    shutil.rmtree(run_dir / "checkpoints" / f"step_{STEPS:06d}")
    out = rl_runs.run(run_dir, *BASE, f"steps={STEPS}", "resume=true", "resume_allow_changes=true", "trainer.dp=2",
                      "cluster.num_cpus=3")  # a bundle per rank and engine, on a 2-core CI box
    assert out.returncode == 0, out.stderr[-3000:]
    assert "the trainer layout changes from" in out.stdout and f"step {STEPS} |" in out.stdout
    rows = rl_runs.rows(run_dir)
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    ref = rl_runs.rows(rl_runs.baseline())[-1]
    # the same global batch from the same weights: the loss agrees to rounding (not bitwise: another reduction order)
    assert abs(rows[-1]["train/loss"] - ref["train/loss"]) <= 1e-3 * max(1.0, abs(ref["train/loss"]))
    saved = json.loads((run_dir / "checkpoints" / f"step_{STEPS:06d}" / "trainer" / "trainer_state.json").read_text())
    assert saved["layout"]["dp"] == 2 and saved["world"] == 2
