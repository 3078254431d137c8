"""Issue 32 item 4: the checkpoint module manages its directory (begin, write, commit, verify, prune) and the loop
fills it; the test-only fault hooks are a FaultPlan the run plan carries, not a global read at import."""

from __future__ import annotations

import errno
import json
import pickle
from pathlib import Path

import pytest
import torch

from top_rl.run import checkpoint, disk_full, faults, rng
from top_rl.run import manifest as checkpoint_manifest
from top_rl.run.fault_injection import NO_FAULTS, POINTS, BadFaultSpec, FaultPlan
from top_rl.tasks import DataPosition

CONFIG = {"steps": 3, "trainer": {"dp": 1, "tp": 1, "pp": 1, "cp": 1}}


def trainer_stand_in(directory: str | Path, world: int = 1) -> None:
    """A small trainer/ as the ranks write it (top_rl.run.dist_state): a DCP entry, the state file, each rank's RNG."""
    from torch.distributed import checkpoint as dcp

    from top_rl.run import trainer_files

    directory = Path(directory)
    dcp.save({"model.w": torch.arange(3.0)}, storage_writer=dcp.FileSystemWriter(str(directory)), no_dist=True)
    (directory / trainer_files.STATE).write_text(json.dumps({"format": trainer_files.STATE_FORMAT, "world": world}))
    for r in range(world):
        (directory / trainer_files.rng_file(r)).write_text(json.dumps(rng.to_json(rng.state())))


def _fill(writer: checkpoint.Writer, world: int = 1) -> None:
    """What the loop writes into a checkpoint, with small stand-ins for the trainer ranks and the HF policy."""
    trainer_stand_in(writer.trainer_dir, world)
    writer.write_driver_state(rng.state())
    Path(writer.hf_dir).mkdir()
    (Path(writer.hf_dir) / "model.safetensors").write_bytes(b"weights")
    writer.write_state(DataPosition(1, 2), "run-a", CONFIG, world, ['{"step": 1}'], None)


def _save(run_dir: Path, step: int, fault_plan: FaultPlan = NO_FAULTS) -> Path:
    with checkpoint.begin(run_dir, step, fault_plan) as writer:
        _fill(writer)
        return writer.commit()


def test_begin_fill_commit_makes_a_checkpoint_that_verifies(tmp_path):
    writer = checkpoint.begin(tmp_path, 4)
    assert writer.tmp == tmp_path / "checkpoints" / "step_000004.tmp" and writer.tmp.is_dir()
    assert Path(writer.trainer_dir).is_absolute() and Path(writer.hf_dir).is_absolute()
    assert Path(writer.trainer_dir).name == "trainer"
    _fill(writer)
    assert checkpoint.latest(tmp_path) is None  # nothing complete before the commit
    final = writer.commit()
    assert final == tmp_path / "checkpoints" / "step_000004" and not writer.tmp.exists()
    assert checkpoint.latest(tmp_path) == final
    state = checkpoint.load_verified(final)
    assert (state["step"], state["world"], state["position"], state["run_id"]) == (4, 1, {"epoch": 1, "index": 2},
                                                                                    "run-a")
    assert state["config"] == CONFIG and "behaviour_version" not in state and "rng" in state["driver"]
    assert (final / checkpoint.METRICS_TAIL).read_text() == '{"step": 1}\n'
    assert sorted(checkpoint_manifest.files(final)) == sorted(  # the manifest lists every file, itself excepted
        str(p.relative_to(final)) for p in final.rglob("*") if p.is_file() and p.name != checkpoint_manifest.NAME)


def test_state_json_records_the_behaviour_version_only_under_a_lag(tmp_path):
    writer = checkpoint.begin(tmp_path, 2)
    writer.write_state(DataPosition(), None, CONFIG, 1, (), behaviour_version=2)
    state = json.loads((writer.tmp / "state.json").read_text())
    assert list(state) == ["format", "step", "position", "run_id", "config", "world", "behaviour_version"]
    assert state["behaviour_version"] == 2 and state["format"] == checkpoint.FORMAT


def test_a_writer_never_committed_leaves_no_checkpoint_and_the_next_begin_cleans_it(tmp_path):
    first = _save(tmp_path, 1)
    abandoned = checkpoint.begin(tmp_path, 2)
    _fill(abandoned)  # everything but the commit: a crash here
    assert checkpoint.latest(tmp_path) == first and checkpoint.complete_checkpoints(tmp_path) == [first]
    assert abandoned.tmp.is_dir()
    old = tmp_path / "checkpoints" / "step_000001.old"  # what an interrupted swap of a step saved twice leaves
    old.mkdir()
    again = checkpoint.begin(tmp_path, 3)
    assert not abandoned.tmp.exists() and not old.exists() and again.tmp.is_dir()
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_000001", "step_000003.tmp"]


def test_a_step_tmp_symlink_is_refused_before_start_and_never_followed(tmp_path):
    """Issue 54 item 7: a checkpoints/step_N.tmp that is a symbolic link failed the run with a FileExistsError after
    step N trained (rmtree refuses a link, quietly; mkdir then found it). Pre-flight now refuses it in one line, and
    a link planted after pre-flight is removed by begin, never what it points to."""
    from top_rl import preflight
    from top_rl.cli import compose

    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("mine")
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    link = run_dir / "checkpoints" / "step_000001.tmp"
    link.symlink_to(outside)
    with pytest.raises(preflight.Refused) as refused:
        preflight.check(compose([f"run_dir={run_dir}", "steps=1", "cluster.torch_threads=1"]))
    assert str(refused.value) == (f"{link} is a symbolic link (to {outside}): top-rl writes only directories there "
                                  f"(an unfinished checkpoint), and would fail replacing it after a step trained; "
                                  f"remove {link} (nothing was written)")
    saved = _save(run_dir, 1)
    assert checkpoint.load_verified(saved)["step"] == 1 and not link.exists() and not link.is_symlink()
    assert sorted(p.name for p in outside.iterdir()) == ["keep.txt"]


def test_a_step_saved_twice_replaces_the_first_copy(tmp_path):
    first = _save(tmp_path, 5)
    (first / "stale").write_text("only in the first copy")
    assert _save(tmp_path, 5) == first
    checkpoint_manifest.verify(first)  # the second copy, whole: the first one's extra file is gone
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_000005"]


def test_prune_keeps_the_newest_n(tmp_path):
    for step in (1, 2, 3, 4):
        _save(tmp_path, step)
    checkpoint.begin(tmp_path, 5)  # a write in progress is no complete checkpoint: prune leaves it alone
    checkpoint.prune(tmp_path, 2)
    assert [p.name for p in checkpoint.complete_checkpoints(tmp_path)] == ["step_000003", "step_000004"]
    assert (tmp_path / "checkpoints" / "step_000005.tmp").is_dir()
    checkpoint.prune(tmp_path, 1)
    assert [p.name for p in checkpoint.complete_checkpoints(tmp_path)] == ["step_000004"]


def _assert_disk_full_stop(stop, tmp_path: Path, last: Path, step: int) -> None:
    root = tmp_path / "checkpoints"
    msg = str(stop.value)
    assert msg.startswith(f"no space left on device while writing the step-{step} checkpoint (the last one, "
                          f"{last.name}, takes {disk_full.size_of(last)}): {root} is on a filesystem with "), msg
    assert f"Last complete checkpoint: {last} (step {checkpoint.step_of(last)})" in msg
    assert sorted(p.name for p in root.iterdir()) == [last.name]  # the partial checkpoint removed
    checkpoint_manifest.verify(last)


def test_commit_on_a_full_disk_stops_as_before_and_keeps_the_last_checkpoint(tmp_path, monkeypatch):
    last = _save(tmp_path, 2)
    writer = checkpoint.begin(tmp_path, 3)
    _fill(writer)

    def full(path):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(checkpoint_manifest, "write", full)
    with pytest.raises(disk_full.DiskFull) as stop:
        writer.commit()  # without a `with`: commit guards its own writes
    _assert_disk_full_stop(stop, tmp_path, last, 3)


def test_a_full_disk_in_a_write_the_loop_hands_out_stops_the_run(tmp_path):
    """A trainer rank's shard write failing for lack of space reaches the driver as ActorFailed (its cause the
    OSError): inside `with begin(...)` it stops the run the same way."""
    last = _save(tmp_path, 2)
    with pytest.raises(disk_full.DiskFull) as stop, checkpoint.begin(tmp_path, 3) as writer:
        try:
            raise OSError(errno.ENOSPC, "No space left on device", writer.trainer_dir)
        except OSError as e:
            raise faults.ActorFailed("trainer rank 0 failed during checkpoint save", "trainer rank 0", False, 0) from e
    _assert_disk_full_stop(stop, tmp_path, last, 3)


def test_the_enospc_fault_point_fires_in_the_drivers_write_of_its_step(tmp_path):
    last = _save(tmp_path, 2, FaultPlan.parse("enospc_in_checkpoint:3"))  # another step's: nothing happens
    with pytest.raises(disk_full.DiskFull) as stop:
        _save(tmp_path, 3, FaultPlan.parse("enospc_in_checkpoint:3"))
    _assert_disk_full_stop(stop, tmp_path, last, 3)


def test_any_other_failure_propagates_and_leaves_the_partial_write_for_the_next_begin(tmp_path):
    with pytest.raises(ValueError, match="not a disk"), checkpoint.begin(tmp_path, 1):
        raise ValueError("not a disk problem")
    assert (tmp_path / "checkpoints" / "step_000001.tmp").is_dir() and checkpoint.latest(tmp_path) is None


# ------------------------------------------------------------------ the fault plan
def test_a_fault_plan_parses_its_points_and_refuses_a_malformed_part():
    plan = FaultPlan.parse(" kill_engine:2, enospc_in_checkpoint:3,")
    assert plan.points == {("kill_engine", 2), ("enospc_in_checkpoint", 3)} and plan
    assert FaultPlan.parse("") == NO_FAULTS and not NO_FAULTS
    for spec, part in [("kill_engine:2,kill_engin:1", "'kill_engin:1' names no fault point"),
                       ("kill_engine", "'kill_engine' is not kill_engine:N"),
                       ("kill_trainer:x", "'kill_trainer:x' is not kill_trainer:N"),
                       ("kill_after_step:0", "'kill_after_step:0' is not kill_after_step:N"),
                       ("kill_after_step:-1", "'kill_after_step:-1' is not kill_after_step:N")]:
        with pytest.raises(BadFaultSpec) as bad:
            FaultPlan.parse(spec)
        assert str(bad.value).startswith(f"TOP_RL_FAULT={spec!r}: {part}"), str(bad.value)
    assert all(p in str(pytest.raises(BadFaultSpec, FaultPlan.parse, "x:1").value) for p in POINTS)


def test_an_empty_plan_injects_nothing_and_a_plan_counts_occurrences_per_process():
    for point in POINTS:
        NO_FAULTS.inject(point, 1, path="x")
    NO_FAULTS.inject("kill_engine")
    assert not NO_FAULTS._calls  # an empty plan does not even count
    plan = FaultPlan.parse("enospc_in_trainer_checkpoint:2")
    plan.inject("enospc_in_trainer_checkpoint", path="a")  # the 1st: nothing
    copy = pickle.loads(pickle.dumps(plan))  # a trainer rank's, sent in its TrainerSpec: counts from 0
    assert copy == plan and not copy._calls
    with pytest.raises(OSError) as e:
        plan.inject("enospc_in_trainer_checkpoint", path="b")  # the 2nd
    assert e.value.errno == errno.ENOSPC and e.value.filename == "b"
    copy.inject("enospc_in_trainer_checkpoint", path="c")  # its 1st
    plan.inject("kill_engine", 2)  # a point the plan does not name
    FaultPlan.parse("kill_after_step:3").inject("kill_after_step", 2)  # another step


def test_the_run_guard_takes_the_plan(tmp_path):
    guard = faults.RunGuard(tmp_path, FaultPlan.parse("enospc_in_checkpoint:1"))
    assert faults.RunGuard(tmp_path).fault_plan is NO_FAULTS
    guard.step_done(1)  # kill_after_step is not in its plan: nothing happens


def test_due_saves_at_the_end_every_k_steps_and_on_a_stop_and_never_when_disabled():
    every3 = checkpoint.CheckpointConfig(every=3)
    assert [s for s in range(1, 8) if checkpoint.due(every3, s, 7)] == [3, 6, 7]
    assert checkpoint.due(checkpoint.CheckpointConfig(), 2, 7, stopping=True)
    off = checkpoint.CheckpointConfig(every=1, enabled=False)
    assert not any(checkpoint.due(off, s, 7, stopping=stop) for s in range(1, 8) for stop in (False, True))
